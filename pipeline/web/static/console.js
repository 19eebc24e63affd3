/* Switchboard console: the chat client of the built-in "console" platform.
 *
 * Plain browser JS, no build step. The server only keeps the BOT's delivered messages per chat
 * (GET api/messages, live on api/stream); what the people typed here is kept locally (per chat, in
 * sessionStorage) and interleaved by time, with the last seq seen of the chat: when the server's
 * chat turns out older than that (a restart on fresh storage, or it expired), the local half goes
 * too, so a chat never shows people talking to a bot that never answered. Chats, users and
 * settings live in localStorage.
 *
 * A bot with a token needs it on every request (`Authorization: Bearer`), the live stream included:
 * the stream is read with fetch(), which can send the header, not with EventSource, which cannot.
 * The token is typed once (⚙ Settings) or comes in the URL fragment (`/console/#token=…`, never sent
 * to the server), and is kept in localStorage. Admins are the bot's configured `admins`.
 *
 * Model text is never assigned as HTML: segments are built with DOM nodes and textContent, and the
 * markdown renderer escapes its input before adding its own, attribute-safe markup.
 */
(() => {
  "use strict";

  // ----------------------------------------------------------------------------------------------
  // Endpoints (relative to /console/, so a path prefix in front of the worker keeps working)

  const API = {
    config: "api/config",
    messages: (bot, chat) => `api/messages?chat_id=${enc(chat)}&bot_id=${enc(bot)}`,
    usage: (bot, chat, user) => `api/usage?chat_id=${enc(chat)}&bot_id=${enc(bot)}&user_id=${enc(user || "")}`,
    stream: (bot, chat, after) => `api/stream?chat_id=${enc(chat)}&bot_id=${enc(bot)}&after=${after}`,
    webhook: (bot) => `../webhooks/console/${enc(bot)}`,
  };
  const POLL_MS = 1000;
  const BACKGROUND_POLL_MS = 5000;
  const LS_KEY = "switchboard.console.v1";
  const SS_KEY = "switchboard.console.sent.v1";
  const SS_SEEN_KEY = "switchboard.console.seen.v1";
  const QUERY = new URLSearchParams(location.search);

  function enc(value) {
    return encodeURIComponent(String(value));
  }

  // ----------------------------------------------------------------------------------------------
  // State

  const state = {
    bots: [],
    botId: null,
    users: [], // {id, name, admin}
    userId: null,
    chats: [], // {botId, id, type, name}
    chatKey: null,
    token: "", // the console's bearer token (every bot that has one)
    transport: "auto",
    sent: {}, // chatKey → [local message]
    seen: {}, // chatKey → the highest seq of the chat this tab has shown (kept with `sent`)
  };
  const runtime = new Map(); // chatKey → {delivered, ids, loaded, es, timer, mode, ...}
  const arrivals = new WeakMap(); // delivered message → when this page first saw it (browser clock)
  // The composer: the mentions picked with the buttons (chips, sent before the text), the message
  // quoted, and the suggestions open while an `@…` is typed.
  const composer = { mentions: [], replyTo: null, suggest: null }; // suggest: {start, end, items, index}
  let clockSkew = 0; // server clock − browser clock, estimated from replies to our messages

  function loadState() {
    try {
      const saved = JSON.parse(localStorage.getItem(LS_KEY) || "{}");
      for (const key of ["botId", "users", "userId", "chats", "chatKey", "token", "transport"]) {
        if (saved[key] !== undefined) state[key] = saved[key];
      }
      // Earlier versions kept a token per bot.
      if (!state.token && saved.tokens && typeof saved.tokens === "object") state.token = Object.values(saved.tokens).find(Boolean) || "";
    } catch (_) { /* a corrupt entry starts afresh */ }
    try {
      state.sent = JSON.parse(sessionStorage.getItem(SS_KEY) || "{}") || {};
    } catch (_) {
      state.sent = {};
    }
    try {
      state.seen = JSON.parse(sessionStorage.getItem(SS_SEEN_KEY) || "{}") || {};
    } catch (_) {
      state.seen = {};
    }
    if (!Array.isArray(state.users)) state.users = [];
    if (!Array.isArray(state.chats)) state.chats = [];
    if (typeof state.token !== "string") state.token = "";
    const forced = QUERY.get("transport");
    if (forced === "poll" || forced === "sse") state.transport = forced === "poll" ? "poll" : "auto";
    // `/console/#token=…`: browsers never send the fragment; take the token and drop it from the URL.
    const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (fragment.get("token")) {
      state.token = fragment.get("token");
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  function authHeaders() {
    return state.token ? { Authorization: `Bearer ${state.token}` } : {};
  }

  function saveState() {
    const { botId, users, userId, chats, chatKey, token, transport } = state;
    try {
      localStorage.setItem(LS_KEY, JSON.stringify({ botId, users, userId, chats, chatKey, token, transport }));
    } catch (_) { /* storage full or disabled: keep going in memory */ }
  }

  const MAX_SENT_PER_CHAT = 500;

  function saveSent() {
    for (const key of Object.keys(state.sent)) {
      const list = state.sent[key];
      if (Array.isArray(list) && list.length > MAX_SENT_PER_CHAT) list.splice(0, list.length - MAX_SENT_PER_CHAT);
    }
    try {
      sessionStorage.setItem(SS_KEY, JSON.stringify(state.sent));
      sessionStorage.setItem(SS_SEEN_KEY, JSON.stringify(state.seen));
    } catch (_) { /* in memory only */ }
  }

  const chatKeyOf = (botId, chatId) => `${botId}\u241f${chatId}`;
  const currentChat = () => state.chats.find((c) => chatKeyOf(c.botId, c.id) === state.chatKey) || null;
  const currentUser = () => state.users.find((u) => u.id === state.userId) || null;
  const currentBot = () => state.bots.find((b) => b.bot_id === state.botId) || null;
  const userById = (id) => state.users.find((u) => u.id === id) || null;
  // Admin status is the bot's configuration (its `admins`), never something this page claims.
  const isAdmin = (userId) => {
    const bot = currentBot();
    return !!bot && Array.isArray(bot.admins) && bot.admins.includes(userId);
  };

  function rt(key) {
    let r = runtime.get(key);
    if (!r) {
      r = { delivered: [], ids: new Set(), lastSeq: 0, loaded: false, es: null, timer: null, mode: "idle", failures: 0,
        opened: false, seen: 0, unread: 0, generation: 0 };
      runtime.set(key, r);
    }
    return r;
  }

  // ----------------------------------------------------------------------------------------------
  // DOM helpers

  const $ = (sel, root = document) => root.querySelector(sel);

  /** h("div", {class: "x", text: "hi", onclick: fn, dataset: {a: 1}}, child, "text", …) */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const [key, value] of Object.entries(attrs)) {
        if (value === undefined || value === null || value === false) continue;
        if (key === "class") el.className = value;
        else if (key === "text") el.textContent = value;
        else if (key === "dataset") Object.assign(el.dataset, value);
        else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
        else if (key in el && typeof value !== "string") el[key] = value;
        else el.setAttribute(key, value === true ? "" : String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  function unescapeHtml(text) {
    return String(text).replace(/&(amp|lt|gt|quot|#39);/g, (_, e) => ({ amp: "&", lt: "<", gt: ">", quot: '"', "#39": "'" })[e]);
  }

  /** A URL safe to put in href/src: http(s), blob, same-origin relative; data: only when allowed. */
  function safeUrl(raw, { data = false } = {}) {
    if (typeof raw !== "string" || !raw.trim()) return null;
    let url;
    try {
      url = new URL(raw.trim(), location.href);
    } catch (_) {
      return null;
    }
    if (url.protocol === "http:" || url.protocol === "https:" || url.protocol === "blob:") return url.href;
    if (data && url.protocol === "data:") return raw.trim();
    return null;
  }

  function hue(text) {
    let n = 0x811c9dc5; // FNV-1a, spread around the colour wheel by the golden angle
    for (const ch of String(text)) n = Math.imul(n ^ ch.codePointAt(0), 0x01000193) >>> 0;
    return Math.round(((n % 997) * 137.508) % 360);
  }

  const ICONS = {
    user: '<path d="M20 21v-2a4 4 0 0 0-4-4H8a4 4 0 0 0-4 4v2"/><circle cx="12" cy="7" r="4"/>',
    users: '<path d="M17 21v-2a4 4 0 0 0-4-4H5a4 4 0 0 0-4 4v2"/><circle cx="9" cy="7" r="4"/><path d="M23 21v-2a4 4 0 0 0-3-3.87"/><path d="M16 3.13a4 4 0 0 1 0 7.75"/>',
    clock: '<circle cx="12" cy="12" r="9"/><path d="M12 7v5l3 2"/>',
  };

  /** One of our own constant SVG icons (never model text). */
  function icon(name, cls = "") {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("class", `icon ${cls}`.trim());
    svg.setAttribute("aria-hidden", "true");
    svg.innerHTML = ICONS[name] || "";
    return svg;
  }

  function avatar(label, seed, extra = "") {
    const initial = (String(label || "?").trim()[0] || "?").toUpperCase();
    return h("span", { class: `avatar ${extra}`.trim(), style: `--h:${hue(seed)}`, "aria-hidden": "true", text: initial });
  }

  function fmtTime(ms) {
    if (!Number.isFinite(ms)) return "";
    return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function fmtDuration(ms) {
    if (!Number.isFinite(ms)) return "";
    if (ms < 0) ms = 0;
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
    const m = Math.floor(ms / 60000);
    return `${m}m ${String(Math.round((ms % 60000) / 1000)).padStart(2, "0")}s`;
  }

  function fmtBytes(n) {
    if (n < 1024) return `${n} B`;
    if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
    return `${(n / 1024 / 1024).toFixed(1)} MB`;
  }

  function newId(prefix) {
    const rnd = crypto.getRandomValues ? [...crypto.getRandomValues(new Uint8Array(6))].map((b) => b.toString(16).padStart(2, "0")).join("")
      : Math.random().toString(16).slice(2, 14);
    return `${prefix}-${Date.now().toString(36)}-${rnd}`;
  }

  // ----------------------------------------------------------------------------------------------
  // Mentions: `@id` written in the text, as the console platform reads it (`mention_segments`): a
  // known id (the bot's self_id, a user of this page) as a word of its own is a mention, in its place.

  const ID_CHARS = "[\\p{L}\\p{N}_]";

  function mentionPattern(ids) {
    const alternatives = [...ids].sort((a, b) => b.length - a.length).map((i) => i.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    return new RegExp(`(?<![\\p{L}\\p{N}_@.])@(${alternatives.join("|")})(?![\\p{L}\\p{N}_-]|\\.${ID_CHARS})`, "gu");
  }

  /** Who can be mentioned here: the bot first, then the users of this page. */
  function mentionables() {
    const bot = currentBot();
    const list = [];
    if (bot && bot.self_id) list.push({ id: bot.self_id, name: bot.bot_id, seed: `bot:${bot.bot_id}`, bot: true });
    for (const u of state.users) if (!list.some((o) => o.id === u.id)) list.push({ id: u.id, name: u.name, seed: u.id });
    return list;
  }

  /** The known ids written `@id` in `text`, in order, once each. */
  function typedMentions(text) {
    const ids = mentionables().map((o) => o.id);
    if (!ids.length || !text.includes("@")) return [];
    return [...new Set([...String(text).matchAll(mentionPattern(ids))].map((m) => m[1]))];
  }

  /** A message as segments: each mentioned id written in the text is a mention in its place; the
   *  others (from older versions of this page) come first. */
  function mentionSegments(text, mentions) {
    const segs = [];
    const written = new Set();
    let at = 0;
    if (mentions.length) {
      for (const m of String(text).matchAll(mentionPattern(mentions))) {
        if (m.index > at) segs.push({ type: "text", data: { text: text.slice(at, m.index) } });
        segs.push({ type: "mention", data: { target: m[1] } });
        written.add(m[1]);
        at = m.index + m[0].length;
      }
    }
    if (at < text.length) segs.push({ type: "text", data: { text: text.slice(at) } });
    return [...mentions.filter((id) => !written.has(id)).map((target) => ({ type: "mention", data: { target } })), ...segs];
  }

  // ----------------------------------------------------------------------------------------------
  // Markdown: a small, safe subset. Input is escaped first; only our own tags are added, and URLs
  // are checked (http, https, mailto) before they become attributes.

  const MD_LIST = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const MD_FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const MD_HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const MD_HR = /^\s{0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const MD_QUOTE = /^\s{0,3}>/;
  const MD_TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  function renderMarkdown(source) {
    const lines = String(source).replace(/\r\n?/g, "\n").replace(/\u0000/g, "").split("\n");
    return mdBlocks(lines, 0);
  }

  function mdIsTable(lines, i) {
    return i + 1 < lines.length && lines[i].includes("|") && lines[i + 1].includes("-") && MD_TABLE_SEP.test(lines[i + 1]);
  }

  function mdIsBlockStart(lines, i) {
    const line = lines[i];
    return MD_FENCE.test(line) || MD_HEADING.test(line) || MD_HR.test(line) || MD_QUOTE.test(line) || MD_LIST.test(line) || mdIsTable(lines, i);
  }

  function mdBlocks(lines, depth) {
    let out = "";
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (/^\s*$/.test(line)) {
        i++;
      } else if ((m = line.match(MD_FENCE))) {
        const fence = m[1];
        const lang = m[2];
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(fence)) body.push(lines[i++]);
        i++;
        out += `<div class="md-code">${lang ? `<span class="md-lang">${escapeHtml(lang)}</span>` : ""}<pre><code>${escapeHtml(body.join("\n"))}</code></pre></div>`;
      } else if ((m = line.match(MD_HEADING))) {
        const level = m[1].length;
        out += `<h${level}>${mdInline(m[2])}</h${level}>`;
        i++;
      } else if (MD_HR.test(line)) {
        out += "<hr>";
        i++;
      } else if (MD_QUOTE.test(line)) {
        const quoted = [];
        while (i < lines.length && MD_QUOTE.test(lines[i])) quoted.push(lines[i++].replace(/^\s{0,3}>\s?/, ""));
        out += `<blockquote>${depth < 6 ? mdBlocks(quoted, depth + 1) : escapeHtml(quoted.join("\n"))}</blockquote>`;
      } else if (MD_LIST.test(line)) {
        const [html, next] = mdList(lines, i, depth);
        out += html;
        i = next;
      } else if (mdIsTable(lines, i)) {
        const [html, next] = mdTable(lines, i);
        out += html;
        i = next;
      } else {
        const para = [lines[i++]];
        while (i < lines.length && !/^\s*$/.test(lines[i]) && !mdIsBlockStart(lines, i)) para.push(lines[i++]);
        out += `<p>${para.map((l) => mdInline(l.trim())).join("<br>")}</p>`;
      }
    }
    return out;
  }

  function mdList(lines, start, depth) {
    const first = lines[start].match(MD_LIST);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const items = [];
    let i = start;
    while (i < lines.length) {
      const line = lines[i];
      const m = line.match(MD_LIST);
      const lead = line.match(/^\s*/)[0].length;
      if (m && lead <= indent + 1 && /\d/.test(m[2]) === ordered) {
        items.push({ text: [m[3]], children: [] });
        i++;
      } else if (m && lead <= indent + 1) {
        break; // a different kind of list starts
      } else if (items.length && lead > indent && !/^\s*$/.test(line)) {
        const last = items[items.length - 1];
        if (m || last.children.length) last.children.push(line);
        else last.text.push(line.trim());
        i++;
      } else if (/^\s*$/.test(line)) {
        let j = i + 1;
        while (j < lines.length && /^\s*$/.test(lines[j])) j++;
        const next = j < lines.length ? lines[j].match(MD_LIST) : null;
        if (next && next[1].length >= indent) i = j;
        else break;
      } else {
        break;
      }
    }
    const tag = ordered ? "ol" : "ul";
    const startNo = ordered ? parseInt(first[2], 10) : 1;
    let html = `<${tag}${ordered && startNo !== 1 ? ` start="${startNo}"` : ""}>`;
    for (const item of items) {
      let text = item.text.map((t) => mdInline(t)).join("<br>");
      let cls = "";
      const task = item.text[0].match(/^\[([ xX])\]\s+/);
      if (task) {
        cls = ` class="md-task"`;
        text = `<span class="md-check">${task[1] === " " ? "☐" : "☑"}</span> ` + mdInline(item.text[0].slice(task[0].length)) +
          item.text.slice(1).map((t) => "<br>" + mdInline(t)).join("");
      }
      let nested = "";
      if (item.children.length) {
        const pad = Math.min(...item.children.filter((l) => l.trim()).map((l) => l.match(/^\s*/)[0].length));
        nested = depth < 6 ? mdBlocks(item.children.map((l) => l.slice(pad)), depth + 1) : escapeHtml(item.children.join("\n"));
      }
      html += `<li${cls}>${text}${nested}</li>`;
    }
    return [html + `</${tag}>`, i];
  }

  function mdSplitRow(line) {
    let row = line.trim();
    if (row.startsWith("|")) row = row.slice(1);
    if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
    return row.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
  }

  function mdTable(lines, start) {
    const head = mdSplitRow(lines[start]);
    const aligns = mdSplitRow(lines[start + 1]).map((c) => (c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : ""));
    let i = start + 2;
    const rows = [];
    while (i < lines.length && lines[i].includes("|") && !/^\s*$/.test(lines[i])) rows.push(mdSplitRow(lines[i++]));
    const cell = (tag, text, col) => `<${tag}${aligns[col] ? ` style="text-align:${aligns[col]}"` : ""}>${mdInline(text)}</${tag}>`;
    let html = `<div class="md-table"><table><thead><tr>${head.map((c, k) => cell("th", c, k)).join("")}</tr></thead><tbody>`;
    for (const row of rows) html += `<tr>${head.map((_, k) => cell("td", row[k] ?? "", k)).join("")}</tr>`;
    return [html + "</tbody></table></div>", i];
  }

  function mdHref(escapedUrl, { image = false } = {}) {
    const raw = unescapeHtml(escapedUrl).trim();
    let url;
    try {
      url = new URL(raw, location.href);
    } catch (_) {
      return null;
    }
    const ok = image ? ["http:", "https:"] : ["http:", "https:", "mailto:"];
    if (!ok.includes(url.protocol)) return null;
    return escapeHtml(url.href);
  }

  function mdEmphasis(s) {
    return s
      .replace(/\*\*\*(?=\S)([\s\S]*?\S)\*\*\*/g, "<strong><em>$1</em></strong>")
      .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
      .replace(/\*(?=[^\s*])([\s\S]*?[^\s*])\*/g, "<em>$1</em>")
      .replace(/\*(?=[^\s*])([^*])\*/g, "<em>$1</em>")
      .replace(/(^|[^\w])_(?=\S)([\s\S]*?\S)_(?!\w)/g, "$1<em>$2</em>")
      .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
  }

  function mdInline(text) {
    const slots = [];
    const keep = (html) => `\u0000${slots.push(html) - 1}\u0000`;
    // Code spans first, on the raw text (their content is literal), then escape everything else.
    let s = String(text).replace(/(`+)([\s\S]*?[^`])\1(?!`)/g, (_, __, code) => keep(`<code>${escapeHtml(code.replace(/^ ([\s\S]*) $/, "$1"))}</code>`));
    s = escapeHtml(s);
    s = s.replace(/!\[([^\]]*)\]\(\s*([^\s)]+)\s*\)/g, (all, alt, url) => {
      const href = mdHref(url, { image: true });
      return href ? keep(`<img class="md-img" src="${href}" alt="${alt}" loading="lazy">`) : all;
    });
    s = s.replace(/\[([^\]]+)\]\(\s*([^\s)]+)(?:\s+&quot;[^&]*&quot;)?\s*\)/g, (all, label, url) => {
      const href = mdHref(url);
      return href ? keep(`<a href="${href}" target="_blank" rel="noopener noreferrer">${mdEmphasis(label)}</a>`) : all;
    });
    s = s.replace(/&lt;((?:https?:\/\/|mailto:)[^\s&]+?)&gt;/g, (all, url) => {
      const href = mdHref(url);
      return href ? keep(`<a href="${href}" target="_blank" rel="noopener noreferrer">${url}</a>`) : all;
    });
    s = s.replace(/\bhttps?:\/\/[^\s<\u0000]+/g, (url) => {
      let tail = "";
      const trimmed = url.replace(/(?:[.,;:!?)\]'"]|&quot;|&#39;|&gt;)+$/, (t) => ((tail = t), ""));
      const href = mdHref(trimmed);
      return href ? keep(`<a href="${href}" target="_blank" rel="noopener noreferrer">${trimmed}</a>`) + tail : url;
    });
    s = mdEmphasis(s);
    for (let guard = 0; guard < 5 && s.includes("\u0000"); guard++) s = s.replace(/\u0000(\d+)\u0000/g, (_, n) => slots[+n]);
    return s;
  }

  // ----------------------------------------------------------------------------------------------
  // Media: url / base64 (type sniffed from the magic bytes) / path and file (server-side only)

  function sniffBase64(b64, family) {
    let bytes;
    try {
      bytes = atob(b64.replace(/\s+/g, "").slice(0, 32).replace(/=+$/, "").slice(0, 24));
    } catch (_) {
      return null;
    }
    const at = (i, str) => bytes.slice(i, i + str.length) === str;
    const code = (i) => bytes.charCodeAt(i);
    if (at(0, "\x89PNG")) return "image/png";
    if (code(0) === 0xff && code(1) === 0xd8 && code(2) === 0xff) return "image/jpeg";
    if (at(0, "GIF8")) return "image/gif";
    if (at(0, "RIFF")) {
      if (at(8, "WEBP")) return "image/webp";
      if (at(8, "WAVE")) return "audio/wav";
      if (at(8, "AVI ")) return "video/x-msvideo";
    }
    if (at(0, "BM")) return "image/bmp";
    if (at(0, "<svg") || at(0, "<?xml")) return "image/svg+xml";
    if (at(0, "\x00\x00\x01\x00")) return "image/x-icon";
    if (at(0, "ID3") || (code(0) === 0xff && (code(1) & 0xe0) === 0xe0 && family !== "image")) return "audio/mpeg";
    if (at(0, "OggS")) return family === "video" ? "video/ogg" : "audio/ogg";
    if (at(0, "fLaC")) return "audio/flac";
    if (at(0, "\x1aE\xdf\xa3")) return family === "audio" ? "audio/webm" : "video/webm";
    if (at(4, "ftyp")) {
      if (at(8, "M4A ")) return "audio/mp4";
      if (at(8, "qt  ")) return "video/quicktime";
      return family === "audio" ? "audio/mp4" : "video/mp4";
    }
    if (at(0, "%PDF")) return "application/pdf";
    if (at(0, "PK\x03\x04")) return "application/zip";
    return null;
  }

  const FAMILY_DEFAULT = { image: "image/png", audio: "audio/mpeg", video: "video/mp4", file: "application/octet-stream" };
  const EXT = { "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "image/svg+xml": "svg",
    "audio/mpeg": "mp3", "audio/wav": "wav", "audio/ogg": "ogg", "video/mp4": "mp4", "video/webm": "webm",
    "application/pdf": "pdf", "application/zip": "zip" };

  /** → {src, mime, name, size} for something the browser can load, or {placeholder, kind, value}. */
  function mediaSource(media, family) {
    const kind = media && media.kind;
    const value = media && typeof media.value === "string" ? media.value : "";
    if (kind === "url") {
      const src = safeUrl(value, { data: /^data:(image|audio|video)\//i.test(value) || family === "file" });
      if (!src) return { placeholder: true, kind, value, reason: "unsupported URL" };
      let name = "";
      try {
        name = decodeURIComponent(new URL(src).pathname.split("/").pop() || "");
      } catch (_) { /* data: URLs have no useful name */ }
      return { src, name: name || `${family}`, mime: "" };
    }
    if (kind === "base64") {
      if (/^data:/i.test(value)) {
        const mime = (value.match(/^data:([^;,]+)/i) || [])[1] || "";
        return { src: value, mime, name: `${family}.${EXT[mime] || "bin"}`, size: Math.floor((value.length - value.indexOf(",") - 1) * 3 / 4) };
      }
      const clean = value.replace(/\s+/g, "");
      const mime = sniffBase64(clean, family) || FAMILY_DEFAULT[family];
      return { src: `data:${mime};base64,${clean}`, mime, name: `${family}.${EXT[mime] || "bin"}`, size: Math.floor(clean.length * 3 / 4) };
    }
    return { placeholder: true, kind: kind || "?", value };
  }

  function mediaPlaceholder(family, icon, info) {
    const where = info.kind === "path" ? "server path" : info.kind === "file" ? "platform file id" : info.reason || info.kind;
    return h("div", { class: `seg seg-${family} media-placeholder`, dataset: { seg: family, kind: info.kind } },
      h("span", { class: "ph-icon", "aria-hidden": "true", text: icon }),
      h("span", { class: "ph-body" },
        h("span", { class: "ph-title", text: `${family} · ${where}` }),
        h("span", { class: "ph-value", text: info.value || "(empty)", title: info.value })));
  }

  // ----------------------------------------------------------------------------------------------
  // Segments

  const FACES = { 0: "😲", 1: "😖", 2: "😍", 3: "😳", 4: "😎", 5: "😭", 6: "☺️", 7: "🤐", 8: "😴", 9: "😢", 10: "😅",
    11: "😠", 12: "😜", 13: "😁", 14: "🙂", 15: "🙁", 16: "😎", 18: "😫", 19: "🤮", 20: "🤭", 21: "😊", 23: "😒",
    24: "😋", 25: "🥱", 26: "😱", 27: "😓", 28: "😄", 29: "🤗", 30: "💪", 31: "🤬", 32: "🤔", 33: "🤫", 34: "😵",
    38: "🔨", 39: "👋", 41: "🥶", 42: "🙏", 49: "🤗", 53: "🎂", 60: "☕", 63: "🌹", 66: "❤️", 67: "💔", 74: "🌞",
    75: "🌙", 76: "👍", 77: "👎", 78: "🤝", 79: "✌️", 89: "🍉", 96: "😰", 97: "😓", 98: "🥱", 99: "👏", 100: "😖",
    101: "😏", 106: "😔", 107: "🥺", 109: "😘", 110: "😮", 111: "🥺", 112: "🔪", 114: "🏀", 116: "💋", 118: "👊",
    120: "✊", 122: "😘", 124: "👌", 144: "🎉", 146: "💢", 147: "🍭", 171: "🍵", 173: "😭", 174: "😑", 175: "😉",
    176: "😌", 177: "😂", 178: "😏", 179: "🐶", 180: "😆", 181: "💩", 182: "😂", 212: "🤲", 277: "🐶" };

  function snippetOf(segments, max = 90) {
    const parts = [];
    for (const seg of Array.isArray(segments) ? segments : []) {
      const d = (seg && seg.data) || {};
      switch (seg && seg.type) {
        case "text": parts.push(d.text); break;
        case "markdown": parts.push(String(d.content || "").replace(/[#*_`>~]|\[|\]\([^)]*\)/g, "")); break;
        case "mention": parts.push(`@${d.target}`); break;
        case "image": case "audio": case "video": case "file": parts.push(`[${seg.type}]`); break;
        case "forward": parts.push("[forwarded]"); break;
        case "face": parts.push(FACES[d.id] || "[face]"); break;
        case "dice": parts.push("🎲"); break;
        case "rps": parts.push("✊✋✌"); break;
        case "share": parts.push(`[${d.title || d.url}]`); break;
        default: break;
      }
    }
    const text = parts.filter(Boolean).join(" ").replace(/\s+/g, " ").trim();
    return text.length > max ? `${text.slice(0, max - 1)}…` : text;
  }

  // What the worker writes in place of a media item it refused (the notice's en and zh defaults).
  const UNAVAILABLE = /(\[attachment unavailable\]|\[附件不可用\])/;

  const SEGMENTS = {
    text(d) {
      const text = String(d.text ?? "");
      const el = h("span", { class: "seg seg-text", dataset: { seg: "text" } });
      // Each "[attachment unavailable]" is a chip of its own (its reason is added by the message).
      for (const [i, part] of text.split(UNAVAILABLE).entries()) {
        if (i % 2) el.append(h("span", { class: "attachment-unavailable", dataset: { testid: "attachment-unavailable" }, text: part }));
        else if (part) el.append(part);
      }
      return el;
    },
    markdown(d) {
      const el = h("div", { class: "seg seg-markdown md", dataset: { seg: "markdown" } });
      el.innerHTML = renderMarkdown(String(d.content ?? "")); // escaped by renderMarkdown
      return el;
    },
    mention(d) {
      const target = String(d.target ?? "");
      const bot = currentBot();
      const user = userById(target);
      const isBot = bot && bot.self_id && bot.self_id === target;
      const me = target === state.userId;
      const el = h("span", {
        class: `seg seg-mention mention-chip${me ? " me" : ""}${isBot ? " bot" : ""}`,
        dataset: { seg: "mention", target },
        title: isBot ? `the bot (${target})` : user ? `${user.name} (${target})` : target,
      }, `@${target}`);
      if (user && user.name && user.name !== target) el.append(h("span", { class: "mention-name", text: user.name }));
      return el;
    },
    image(d) {
      const info = mediaSource(d.media, "image");
      if (info.placeholder) return mediaPlaceholder("image", "🖼", info);
      const img = h("img", { src: info.src, alt: info.name || "image", loading: "lazy", decoding: "async" });
      const fig = h("figure", { class: "seg seg-image", dataset: { seg: "image", kind: d.media.kind } },
        h("button", { type: "button", class: "img-btn", title: "Open", "aria-label": "Open image", onclick: () => openLightbox(info.src) }, img));
      if (d.media.kind === "base64") fig.append(h("figcaption", { text: `${info.mime} · ${fmtBytes(info.size || 0)}` }));
      img.addEventListener("error", () => fig.replaceWith(mediaPlaceholder("image", "🖼", { kind: d.media.kind, value: String(d.media.value).slice(0, 120), reason: "failed to load" })), { once: true });
      return fig;
    },
    audio(d) {
      const info = mediaSource(d.media, "audio");
      if (info.placeholder) return mediaPlaceholder("audio", "🎵", info);
      return h("div", { class: "seg seg-audio", dataset: { seg: "audio", kind: d.media.kind } },
        h("span", { class: "media-label", text: `🎵 ${info.name}` }),
        h("audio", { controls: true, preload: "metadata", src: info.src }));
    },
    video(d) {
      const info = mediaSource(d.media, "video");
      if (info.placeholder) return mediaPlaceholder("video", "🎬", info);
      return h("div", { class: "seg seg-video", dataset: { seg: "video", kind: d.media.kind } },
        h("video", { controls: true, preload: "metadata", src: info.src, playsInline: true }),
        h("span", { class: "media-label", text: `🎬 ${info.name}` }));
    },
    file(d) {
      const info = mediaSource(d.media, "file");
      if (info.placeholder) {
        const name = String(info.value || "").split(/[\\/]/).pop() || "file";
        return h("span", { class: "seg seg-file file-chip disabled", dataset: { seg: "file", kind: info.kind }, title: info.value },
          h("span", { class: "file-icon", "aria-hidden": "true", text: "📄" }),
          h("span", { class: "file-name", text: name }),
          h("span", { class: "file-meta", text: info.kind === "path" ? "server path" : info.kind === "file" ? "file id" : info.reason || "" }));
      }
      return h("a", { class: "seg seg-file file-chip", dataset: { seg: "file", kind: d.media.kind }, href: info.src, download: info.name,
        target: "_blank", rel: "noopener noreferrer", title: `Download ${info.name}` },
      h("span", { class: "file-icon", "aria-hidden": "true", text: "📄" }),
      h("span", { class: "file-name", text: info.name }),
      h("span", { class: "file-meta", text: info.size ? fmtBytes(info.size) : "download" }),
      h("span", { class: "file-dl", "aria-hidden": "true", text: "⬇" }));
    },
    reply(d) {
      const id = String(d.message_id ?? "");
      const ref = findMessage(id);
      return h("button", { type: "button", class: "seg seg-reply quote", dataset: { seg: "reply", ref: id },
        title: `In reply to ${id}`, onclick: (ev) => { ev.stopPropagation(); flashMessage(id); } },
      h("span", { class: "quote-who", text: ref ? `↩ ${ref.author}` : "↩ In reply to" }),
      h("span", { class: "quote-text", text: ref ? ref.snippet || "(no text)" : id }));
    },
    forward(d) {
      return h("span", { class: "seg seg-forward chip", dataset: { seg: "forward" }, title: `Forwarded messages ${d.forward_id}` },
        h("span", { "aria-hidden": "true", text: "⤳ " }), "Forwarded messages ",
        h("code", { text: String(d.forward_id ?? "") }));
    },
    face(d) {
      const id = d.id;
      return h("span", { class: "seg seg-face chip face", dataset: { seg: "face", id: String(id) }, title: `face ${id}` },
        h("span", { class: "face-emoji", text: FACES[id] || "🙂" }), h("span", { class: "face-id", text: `#${id}` }));
    },
    dice() {
      return h("span", { class: "seg seg-dice chip game", dataset: { seg: "dice" }, title: "Dice" },
        h("span", { class: "game-emoji", text: "🎲" }), "dice");
    },
    rps() {
      return h("span", { class: "seg seg-rps chip game", dataset: { seg: "rps" }, title: "Rock paper scissors" },
        h("span", { class: "game-emoji", text: "✊✋✌" }), "rock · paper · scissors");
    },
    share(d) {
      const href = safeUrl(String(d.url ?? ""));
      let host = String(d.url ?? "");
      try {
        host = new URL(href).host;
      } catch (_) { /* keep the raw text */ }
      const body = [
        h("span", { class: "share-icon", "aria-hidden": "true", text: "🔗" }),
        h("span", { class: "share-body" },
          h("span", { class: "share-title", text: String(d.title || d.url || "link") }),
          h("span", { class: "share-host", text: host })),
      ];
      return href
        ? h("a", { class: "seg seg-share share-card", dataset: { seg: "share" }, href, target: "_blank", rel: "noopener noreferrer" }, body)
        : h("span", { class: "seg seg-share share-card disabled", dataset: { seg: "share" } }, body);
    },
  };

  /** The reasons the worker gave for the media it refused, in order, on their placeholders. */
  function labelUnavailable(body, reasons) {
    if (!Array.isArray(reasons)) return;
    const chips = body.querySelectorAll(".attachment-unavailable");
    chips.forEach((chip, i) => {
      if (typeof reasons[i] !== "string" || !reasons[i]) return;
      const reason = reasons[i].replace(/_/g, " ");
      chip.dataset.reason = reasons[i];
      chip.title = `Refused: ${reason}`;
      chip.append(h("span", { class: "unavailable-reason", text: ` · ${reason}` }));
    });
  }

  function renderSegment(seg) {
    const render = seg && SEGMENTS[seg.type];
    if (!render) {
      return h("code", { class: "seg seg-unknown chip", dataset: { seg: "unknown" }, text: `[${seg && seg.type}] ${JSON.stringify(seg && seg.data)}` });
    }
    try {
      return render((seg.data && typeof seg.data === "object") ? seg.data : {});
    } catch (err) {
      return h("code", { class: "seg seg-error chip", text: `[${seg.type}: ${err.message}]` });
    }
  }

  /** Consecutive images share one row (a gallery); everything else flows in order. */
  function appendSegments(body, segments) {
    let gallery = null;
    for (const seg of segments) {
      const el = renderSegment(seg);
      if (seg && seg.type === "image") {
        if (!gallery) body.append((gallery = h("div", { class: "seg-gallery" })));
        gallery.append(el);
      } else {
        gallery = null;
        body.append(el);
      }
    }
  }

  // ----------------------------------------------------------------------------------------------
  // Message list: delivered (bot) + local (people) messages, merged by time

  function findMessage(id) {
    if (!id) return null;
    const chatRt = state.chatKey ? runtime.get(state.chatKey) : null;
    if (chatRt) {
      const msg = chatRt.delivered.find((m) => m.id === id);
      if (msg) return { author: currentBot() ? currentBot().bot_id : "bot", snippet: snippetOf(msg.segments), bot: true };
    }
    const local = (state.sent[state.chatKey] || []).find((m) => m.id === id);
    if (local) return { author: local.userName || local.userId, snippet: snippetOf(localSegments(local)) };
    return null;
  }

  function localSegments(m) {
    return mentionSegments(String(m.text || ""), Array.isArray(m.mentions) ? m.mentions : []);
  }

  function timelineOf(key) {
    const chatRt = rt(key);
    const local = state.sent[key] || [];
    const byId = new Map(local.map((m) => [m.id, m]));
    // Bot messages keep their delivery order; a reply is never shown above the message it answers.
    let floor = -Infinity;
    // A refusal of someone's /allow or /deny is shown to that person only, with their answer.
    const shown = chatRt.delivered.filter((msg) => !isRefusal(msg));
    const bot = shown.map((msg, index) => {
      let t = Number(msg.delivered_at) || Number(msg.hops && msg.hops.ingress) || 0;
      // Seen here before something was typed → shown before it, whatever the clocks say.
      const seen = arrivals.get(msg);
      if (seen !== undefined) t = Math.min(t, seen + clockSkew);
      const ref = msg.reply_to && byId.get(msg.reply_to);
      if (ref) t = Math.max(t, ref.sentAt + clockSkew + 1);
      t = Math.max(t, floor);
      floor = t;
      return { key: `d:${msg.id || index}`, who: "bot", msg, t, index };
    });
    const people = local.map((msg) => ({ key: `l:${msg.id}`, who: "user", msg, t: msg.sentAt + clockSkew }));
    const merged = [];
    let a = 0;
    let b = 0;
    while (a < bot.length || b < people.length) {
      if (b >= people.length || (a < bot.length && bot[a].t < people[b].t)) merged.push(bot[a++]);
      else merged.push(people[b++]);
    }
    return merged;
  }

  const rendered = new Map(); // item key → {el, sig}
  let renderedChat = null;

  function renderMessages({ forceBottom = false } = {}) {
    const box = $("#messages");
    const key = state.chatKey;
    if (renderedChat !== key) {
      for (const { el } of rendered.values()) el.remove();
      rendered.clear();
      renderedChat = key;
      forceBottom = true;
    }
    const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    const items = key ? timelineOf(key) : [];
    $("#empty").hidden = items.length > 0;
    const live = new Set();
    let prev = $("#empty");
    let prevItem = null;
    for (const item of items) {
      live.add(item.key);
      // Consecutive messages of one author are grouped (one name, one avatar); bot kinds other
      // than a plain reply always show their label.
      const plain = (m) => !m.kind || m.kind === "reply";
      const grouped = !!prevItem && prevItem.who === item.who && plain(item.msg) && plain(prevItem.msg) &&
        (item.who === "bot" || prevItem.msg.userId === item.msg.userId) && item.t - prevItem.t < 120000;
      const sig = signature(item, grouped);
      let entry = rendered.get(item.key);
      if (!entry || entry.sig !== sig) {
        const el = item.who === "bot" ? renderBotMessage(item.msg, grouped) : renderLocalMessage(item.msg, grouped);
        if (entry) entry.el.replaceWith(el);
        entry = { el, sig };
        rendered.set(item.key, entry);
      }
      if (prev.nextSibling !== entry.el) prev.after(entry.el);
      prev = entry.el;
      prevItem = item;
    }
    for (const [k, entry] of rendered) {
      if (!live.has(k)) {
        entry.el.remove();
        rendered.delete(k);
      }
    }
    renderTyping(key, prev);
    if (forceBottom || nearBottom) box.scrollTop = box.scrollHeight;
  }

  // The bot at work: a message of this chat reached the agent and nothing but progress came back
  // yet. Platforms show their own typing indicator; this is the console's. Shown at most this long
  // after the message or the chat's last progress message: a turn the agent ends without a reply
  // (it may choose silence) or one lost to an outage sends nothing, and must not leave it up.
  const TYPING_MAX_MS = 3 * 60 * 1000;
  const ENDS_TURNS = /^\s*\/(stop|reset)\b/i; // commands that start no turn (their notice comes at once)
  let typingTimer = null;

  /** When the bot started on the oldest message of the chat it still works on (browser clock), or
   *  null. Started: sent, reached the agent (the worker said so in its answer), not dropped; for a
   *  message held behind a running turn, when it was taken up (held, the bot is busy anyway).
   *  Ended by any delivery but progress after it (a reply, a notice, a confirmation: that one waits
   *  for people) or by one quoting it. */
  function workingSince(key) {
    const chatRt = rt(key);
    const now = Date.now();
    // The server's clock, as this browser's: also right for what a reload loads.
    const at = (d) => (Number.isFinite(Number(d.delivered_at)) ? Number(d.delivered_at) - clockSkew : arrivals.get(d) ?? 0);
    const progress = chatRt.delivered.reduce((t, d) => (d.kind === "progress" ? Math.max(t, at(d)) : t), 0);
    let since = null;
    let until = 0;
    for (const m of state.sent[key] || []) {
      if (m.status !== "sent" || m.addressed !== true || m.note === "dropped" || ENDS_TURNS.test(m.text)) continue;
      const start = Math.max(m.postedAt || m.sentAt, m.noteAt || 0);
      const shownUntil = Math.max(start, progress) + TYPING_MAX_MS;
      if (now > shownUntil) continue;
      const ended = m.note !== "held" && chatRt.delivered.some((d) => d.kind !== "progress" && (d.reply_to === m.id || at(d) >= start));
      if (ended) continue;
      if (since === null || start < since) since = start;
      until = Math.max(until, shownUntil);
    }
    return since === null ? null : { since, until };
  }

  function renderTyping(key, prev) {
    const working = key ? workingSince(key) : null;
    let typing = $("#typing");
    clearTimeout(typingTimer);
    if (working === null) {
      if (typing) typing.remove();
      return;
    }
    const bot = currentBot();
    const name = (bot && bot.bot_id) || "bot";
    if (!typing || typing.dataset.bot !== name) {
      if (typing) typing.remove();
      typing = h("div", { class: "typing-row", id: "typing", role: "status", dataset: { testid: "typing", bot: name } },
        avatar(name, `bot:${name}`, "bot"),
        h("div", { class: "bubble", title: "The bot is working on a message of this chat" },
          h("span", { class: "typing-dots", "aria-hidden": "true" }, h("i"), h("i"), h("i")),
          h("span", { class: "typing-label", text: `${name} is typing…` })));
    }
    if (prev.nextSibling !== typing) prev.after(typing);
    typingTimer = setTimeout(() => renderMessages(), working.until - Date.now() + 100);
  }

  function signature(item, grouped) {
    const m = item.msg;
    const answered = item.who === "bot" && m.kind === "confirmation" ? answeredConfirmation(m) : "";
    // Re-render only what changed (keeps audio/video players alive): a bot message depends on the
    // current user only through mention highlighting and the confirmation hint.
    const userDependent = item.who === "user" || m.kind === "confirmation" ||
      (Array.isArray(m.segments) && m.segments.some((seg) => seg && seg.type === "mention"));
    const who = item.who === "user" ? `${m.status}|${m.error || ""}|${m.note || ""}|${m.addressed}|${refusalOf(m.id)}`
      : `${answered}|${m.kind === "confirmation" ? `${refusedForCurrentUser(m)}|${pendingAnswers(m)}` : ""}`;
    return `${grouped}|${who}|${composer.replyTo === m.id}|${userDependent ? state.userId : ""}|${quoteSignature(item)}`;
  }

  const ANSWER = /^\s*\/(allow|deny)\b/i; // an answer to a tool confirmation
  const isRefusal = (msg) => msg.kind === "notice" && Array.isArray(msg.notes) && msg.notes.includes("refused");

  // The refusals of the open chat by the message they refuse, rebuilt when its deliveries change
  // (every message drawn asks).
  const refusals = { list: null, length: -1, byAnswer: new Map() };

  /** The text of the notice refusing the message `id` (an /allow or /deny), if one came. */
  function refusalOf(id) {
    const chatRt = state.chatKey ? runtime.get(state.chatKey) : null;
    if (!chatRt) return "";
    if (refusals.list !== chatRt.delivered || refusals.length !== chatRt.delivered.length) {
      refusals.byAnswer = new Map(chatRt.delivered.filter(isRefusal).map((msg) => [msg.reply_to, snippetOf(msg.segments, 200) || "refused"]));
      refusals.list = chatRt.delivered;
      refusals.length = chatRt.delivered.length;
    }
    return refusals.byAnswer.get(id) || "";
  }

  function latestConfirmation(key) {
    const confirmations = rt(key).delivered.filter((d) => d.kind === "confirmation");
    return confirmations.length ? confirmations[confirmations.length - 1].id : null;
  }

  /** The answers sent from here to a confirmation, not failed: those sent for it (an answer kept
   *  by an older version of this page: any /allow or /deny sent after it). */
  function confirmationAnswers(msg) {
    const after = Number(msg.delivered_at) - clockSkew;
    return (state.sent[state.chatKey] || []).filter((m) => ANSWER.test(m.text) && m.status !== "failed" &&
      (m.confirms !== undefined ? m.confirms === msg.id : m.sentAt >= after - 1000));
  }

  /** What became of an answer: "refused" (the bot's notice says so), "accepted" (sure to be let
   *  through, in a private chat or from one of the bot's admins, or the bot went on after it), else
   *  "pending": until the bot says, the confirmation stays open. */
  function answerState(answer) {
    if (refusalOf(answer.id)) return "refused";
    const chat = currentChat();
    if ((chat && chat.type === "private") || isAdmin(answer.userId)) return "accepted";
    const chatRt = runtime.get(state.chatKey);
    // Delivered after it by the server's clock, and seen here after it was sent.
    const after = (d) => !isRefusal(d) && Number(d.delivered_at) > answer.sentAt + clockSkew && (arrivals.get(d) ?? Infinity) > answer.sentAt;
    return chatRt && chatRt.delivered.some(after) ? "accepted" : "pending";
  }

  const answerLabel = (m) => `${m.text.trim().split(/\s/)[0]} by ${m.userName || m.userId}`;

  /** Who answered a confirmation ("/allow by Bob"); an answer refused, or not yet let through, does not count. */
  function answeredConfirmation(msg) {
    const answer = confirmationAnswers(msg).find((m) => answerState(m) === "accepted");
    return answer ? answerLabel(answer) : "";
  }

  /** Answers sent and not yet let through nor refused ("/allow by Carol"). */
  function pendingAnswers(msg) {
    return confirmationAnswers(msg).filter((m) => answerState(m) === "pending").map(answerLabel).join(", ");
  }

  /** The refusal of the current user's last answer to a confirmation (shown to them only). */
  function refusedForCurrentUser(msg) {
    const mine = confirmationAnswers(msg).filter((m) => m.userId === state.userId);
    return mine.length ? refusalOf(mine[mine.length - 1].id) : "";
  }

  /** The messages a message quotes, each marked resolved or not: a quote shown before the message
   *  it quotes was loaded is drawn again once it is (after a reload, history comes after the
   *  messages kept in this tab). */
  function quoteSignature(item) {
    const m = item.msg;
    const ids = item.who === "user" ? [m.replyTo] : [m.reply_to,
      ...(Array.isArray(m.segments) ? m.segments : []).filter((seg) => seg && seg.type === "reply").map((seg) => seg.data && seg.data.message_id)];
    return ids.filter(Boolean).map((id) => (findMessage(String(id)) ? "1" : "0")).join("");
  }

  function messageShell({ side, kind, id, grouped, author, authorSeed, isBot }) {
    const classes = ["msg", `msg--${kind}`, side === "out" ? "msg--out" : "msg--in"];
    if (grouped) classes.push("msg--grouped");
    if (composer.replyTo === id) classes.push("msg--replying");
    const el = h("article", { class: classes.join(" "), dataset: { id, kind, side }, tabindex: "0",
      "aria-label": `${author}: message (Enter to reply)` });
    el.addEventListener("keydown", (ev) => {
      if (ev.target !== el || (ev.key !== "Enter" && ev.key !== "r")) return;
      ev.preventDefault();
      setReplyTo(composer.replyTo === id ? null : id);
    });
    if (kind !== "notice") {
      el.append(grouped ? h("span", { class: "avatar-spacer" }) : avatar(author, authorSeed, isBot ? "bot" : ""));
    }
    el.addEventListener("click", (ev) => {
      if (ev.target.closest("a, button, audio, video, input, select, textarea")) return;
      if (String(window.getSelection && window.getSelection()).length) return; // selecting text
      setReplyTo(composer.replyTo === id ? null : id);
    });
    return el;
  }

  function renderBotMessage(msg, grouped) {
    const kind = ["reply", "notice", "progress", "confirmation"].includes(msg.kind) ? msg.kind : "reply";
    const bot = currentBot();
    const botName = (bot && bot.bot_id) || "bot";
    const el = messageShell({ side: "in", kind, id: msg.id, grouped, author: botName, authorSeed: `bot:${botName}`, isBot: true });
    const bubble = h("div", { class: "bubble" });
    if (!grouped) {
      const labels = { notice: "notice", progress: "working…", confirmation: "needs confirmation" };
      bubble.append(h("div", { class: "msg-head" },
        h("span", { class: "msg-author", text: botName }),
        h("span", { class: "bot-badge", text: "BOT" }),
        labels[kind] ? h("span", { class: `kind-badge kind-${kind}`, text: labels[kind] }) : null));
    }
    if (kind === "notice") bubble.prepend(h("span", { class: "notice-icon", "aria-hidden": "true", text: "ℹ" }));
    if (msg.reply_to && !(msg.segments || []).some((s) => s && s.type === "reply")) {
      bubble.append(SEGMENTS.reply({ message_id: msg.reply_to }));
    }
    const body = h("div", { class: "msg-body" });
    appendSegments(body, Array.isArray(msg.segments) ? msg.segments : []);
    labelUnavailable(body, msg.media_rejected);
    bubble.append(body);
    if (kind === "confirmation") {
      const answered = answeredConfirmation(msg);
      bubble.append(h("div", { class: "confirm-actions" },
        h("button", { type: "button", class: "btn ok", dataset: { testid: "confirm-allow" }, disabled: !!answered || undefined,
          onclick: () => sendText("/allow", { confirms: msg.id }) }, "✓ Allow"),
        h("button", { type: "button", class: "btn danger", dataset: { testid: "confirm-deny" }, disabled: !!answered || undefined,
          onclick: () => sendText("/deny", { confirms: msg.id }) }, "✕ Deny"),
        h("span", { class: "confirm-hint", text: answered ? `answered: ${answered}`
          : [pendingAnswers(msg) && `${pendingAnswers(msg)}: waiting for the bot…`, `as ${currentUser() ? currentUser().name : "?"}`].filter(Boolean).join(" · ") })));
      const refused = !answered && refusedForCurrentUser(msg);
      if (refused) {
        bubble.append(h("div", { class: "confirm-refused", role: "status", dataset: { testid: "confirm-refused" },
          title: "Only you see this: the bot refused your answer" }, h("span", { class: "refused-label", text: "Your answer was refused: " }), refused));
      }
    }
    bubble.append(botMeta(msg));
    el.append(bubble);
    return el;
  }

  function botMeta(msg) {
    const hops = msg.hops && typeof msg.hops === "object" ? msg.hops : {};
    const ingress = Number(hops.ingress);
    const delivered = Number(msg.delivered_at);
    const meta = h("div", { class: "msg-meta" });
    if (Array.isArray(msg.notes) && msg.notes.includes("corrected")) {
      meta.append(msgNote("corrected", "corrected", "The agent's reply broke the reply format; one correction call fixed it"));
    }
    meta.append(h("time", { text: fmtTime(delivered), datetime: Number.isFinite(delivered) ? new Date(delivered).toISOString() : undefined }));
    if (Number.isFinite(ingress) && Number.isFinite(delivered)) {
      // Measured from the message that started the turn (its `ingress`): after a confirmation that
      // includes the time people took to answer it, which is said, not hidden in the figure.
      const total = delivered - ingress;
      const waited = confirmationWait(msg);
      const stages = Object.entries(hops).filter(([, v]) => Number.isFinite(Number(v))).sort((x, y) => x[1] - y[1])
        .map(([k, v]) => `${k} +${fmtDuration(Number(v) - ingress)}`);
      stages.push(`delivered +${fmtDuration(total)}`);
      const lines = [`${fmtDuration(total)} after the message that started this turn`];
      if (waited) lines.push(waited.ms === null ? "including the wait for an answer to the confirmation"
        : `${fmtDuration(waited.ms)} of it waiting for ${waited.answer}`);
      const text = waited && waited.ms !== null ? `${fmtDuration(total)} (${fmtDuration(waited.ms)} until ${waited.answer})` : fmtDuration(total);
      meta.append(h("span", { class: "latency", dataset: { testid: "latency" },
        title: `${lines.join("\n")}\n\n${stages.join("\n")}${msg.trace_id ? `\ntrace ${msg.trace_id}` : ""}` },
      icon("clock"), text));
    }
    return meta;
  }

  /** For a message of a turn that asked for a confirmation first: how long the confirmation waited
   *  for its answer (ms, from this tab's answers; null when answered elsewhere) and the answer. */
  function confirmationWait(msg) {
    if (!msg.trace_id || msg.kind === "confirmation") return null;
    const chatRt = state.chatKey ? runtime.get(state.chatKey) : null;
    if (!chatRt) return null;
    const at = Number(msg.delivered_at);
    const asked = chatRt.delivered.filter((d) => d.kind === "confirmation" && d.trace_id === msg.trace_id && Number(d.delivered_at) < at);
    if (!asked.length) return null;
    let ms = 0;
    let answer = "";
    for (const d of asked) {
      const answers = confirmationAnswers(d).filter((m) => m.status === "sent" && !refusalOf(m.id));
      if (!answers.length) return { ms: null, answer: "" };
      const first = answers.reduce((a, b) => ((a.postedAt || a.sentAt) <= (b.postedAt || b.sentAt) ? a : b));
      ms += Math.max(0, (first.postedAt || first.sentAt) + clockSkew - Number(d.delivered_at));
      answer = first.text.trim().split(/\s/)[0];
    }
    return { ms, answer };
  }

  function msgNote(note, text, title) {
    return h("span", { class: `msg-note note-${note}`, dataset: { testid: "msg-note", note }, title, text });
  }

  const NOTE_TITLES = {
    held: "The bot is busy: this message waits for the current turn to end",
    released: "The bot took this message up after the turn it waited for",
    merged: "The bot took this message up together with the others that waited",
    dropped: "/stop dropped this message before the bot saw it",
  };

  function renderLocalMessage(m, grouped) {
    const mine = m.userId === state.userId;
    const el = messageShell({ side: mine ? "out" : "in", kind: "user", id: m.id, grouped, author: m.userName || m.userId, authorSeed: m.userId });
    el.classList.add("msg--person");
    const bubble = h("div", { class: "bubble", style: `--h:${hue(m.userId)}` });
    if (!grouped) {
      bubble.append(h("div", { class: "msg-head" },
        h("span", { class: "msg-author", text: m.userName || m.userId }),
        h("span", { class: "msg-uid", text: m.userId }),
        isAdmin(m.userId) ? h("span", { class: "admin-badge", text: "admin" }) : null));
    }
    if (m.replyTo) bubble.append(SEGMENTS.reply({ message_id: m.replyTo }));
    const body = h("div", { class: "msg-body" });
    for (const seg of localSegments(m)) body.append(renderSegment(seg));
    if (/^\s*\/(stop|reset|allow|deny)\b/i.test(m.text)) body.classList.add("is-command");
    bubble.append(body);
    const status = { sending: "sending…", sent: "✓ sent", failed: "failed" }[m.status] || m.status;
    const meta = h("div", { class: "msg-meta" });
    const refused = refusalOf(m.id);
    if (refused) {
      bubble.append(h("div", { class: "msg-refused", dataset: { testid: "msg-refused" } }, h("span", { class: "refused-label", text: "refused: " }), refused));
    }
    if (m.status === "sent" && m.addressed === false) {
      meta.append(msgNote("unaddressed", "not addressed to the bot",
        "In a group the bot reads this as context only: @mention it, reply to it, or send a command to reach it"));
    }
    if (Object.hasOwn(NOTES, m.note || "")) meta.append(msgNote(m.note, NOTES[m.note], NOTE_TITLES[m.note]));
    meta.append(h("time", { text: fmtTime(m.sentAt) }), h("span", { class: `status status-${m.status}`, title: m.error || "", text: status }));
    if (m.status === "failed") {
      meta.append(h("span", { class: "status-error", text: m.error || "" }),
        h("button", { type: "button", class: "link-btn", text: "retry", onclick: () => deliverLocal(state.chatKey, m) }));
    }
    bubble.append(meta);
    el.append(bubble);
    return el;
  }

  function flashMessage(id) {
    const el = [...document.querySelectorAll("#messages .msg")].find((x) => x.dataset.id === id);
    if (!el) return;
    el.scrollIntoView({ block: "center", behavior: "smooth" });
    el.classList.remove("flash");
    void el.offsetWidth;
    el.classList.add("flash");
  }

  function openLightbox(src) {
    $("#lightbox-img").src = src;
    $("#lightbox").hidden = false;
  }

  // ----------------------------------------------------------------------------------------------
  // Delivered messages: initial load, live stream, polling fallback, background unread counts

  function addDelivered(key, messages) {
    const chatRt = rt(key);
    let added = 0;
    for (const msg of messages) {
      if (!msg || typeof msg !== "object") continue;
      const id = msg.id || `#${chatRt.delivered.length}`;
      if (chatRt.ids.has(id)) continue;
      chatRt.ids.add(id);
      chatRt.delivered.push(msg);
      if (Number.isInteger(msg.seq) && msg.seq > chatRt.lastSeq) chatRt.lastSeq = msg.seq;
      arrivals.set(msg, Date.now());
      added++;
      learnSkew(key, msg);
    }
    noteSeen(key);
    if (added && key === state.chatKey) refreshUsage(key);
    if (added && key === state.chatKey) renderMessages();
    else if (added) {
      chatRt.unread += added;
      renderChatList();
    }
    return added;
  }

  /** Kept with the messages typed here: how far this tab has seen the chat on the server. */
  function noteSeen(key) {
    const chatRt = rt(key);
    if (chatRt.lastSeq <= (Number(state.seen[key]) || 0)) return;
    state.seen[key] = chatRt.lastSeq;
    saveSent();
  }

  /** Whether the server's chat (its newest seq) is older than what this tab has shown of it. */
  function chatWasReset(key, messages) {
    const newest = messages.reduce((n, m) => (m && Number.isInteger(m.seq) && m.seq > n ? m.seq : n), 0);
    return newest < Math.max(rt(key).lastSeq, Number(state.seen[key]) || 0);
  }

  /** The server no longer has what this tab showed of a chat (a restart on fresh storage, or the
   *  chat expired): the bot's side is gone, so the people's side goes with it; a chat never shows
   *  messages the bot seems not to have answered. Kept: messages sent since the connection broke
   *  (they went to the server as it is now), and those quoted by what the server has now. */
  function forgetChat(key, messages) {
    const chatRt = rt(key);
    chatRt.delivered = [];
    chatRt.ids.clear();
    chatRt.lastSeq = 0;
    const quoted = new Set(messages.map((m) => m && m.reply_to).filter(Boolean));
    const since = chatRt.brokeAt || Infinity;
    const local = state.sent[key] || [];
    const kept = local.filter((m) => quoted.has(m.id) || (m.postedAt || m.sentAt) >= since);
    state.sent[key] = kept;
    state.seen[key] = 0;
    saveSent();
    if (key === state.chatKey) {
      if (kept.length < local.length) {
        showBanner("The server no longer has this chat's earlier messages (restarted on fresh storage, or expired): they are cleared here too.", "info");
      }
      renderMessages();
    }
  }

  function learnSkew(key, msg) {
    const ref = msg.reply_to && (state.sent[key] || []).find((m) => m.id === msg.reply_to);
    const ingress = msg.hops && Number(msg.hops.ingress);
    if (ref && Number.isFinite(ingress) && ref.postedAt) {
      // ingress is stamped while our POST was in flight: between postedAt and ackAt (browser clock).
      const mid = ref.ackAt ? (ref.postedAt + ref.ackAt) / 2 : ref.postedAt;
      clockSkew = ingress - mid;
    }
  }

  // Status notes (live only, never stored): what became of messages sent from here while the bot
  // was busy: held, then released or merged into one turn, or dropped by /stop.
  const NOTES = { held: "held", released: "released", merged: "merged", dropped: "dropped" };

  function applyNote(key, note) {
    if (!note || !Object.hasOwn(NOTES, note.note) || !Array.isArray(note.message_ids)) return;
    const ids = new Set(note.message_ids.map(String));
    let changed = false;
    for (const m of state.sent[key] || []) {
      if (ids.has(m.id) && m.note !== note.note) {
        m.note = note.note;
        m.noteAt = Date.now(); // a held message's turn starts when it is taken up (the typing bubble)
        changed = true;
      }
    }
    if (!changed) return;
    saveSent();
    if (key === state.chatKey) renderMessages();
  }

  async function fetchJson(url, init) {
    const res = await fetch(url, { cache: "no-store", ...init });
    let body = null;
    try {
      body = await res.json();
    } catch (_) { /* not JSON */ }
    if (!res.ok) {
      const err = new Error((body && (body.error || body.detail)) || `${res.status} ${res.statusText}`);
      err.status = res.status;
      throw err;
    }
    return body;
  }

  async function loadMessages(key) {
    const [botId, chatId] = key.split("\u241f");
    const body = await fetchJson(API.messages(botId, chatId), { headers: authHeaders() });
    const chatRt = rt(key);
    const messages = Array.isArray(body && body.messages) ? body.messages : [];
    if (chatWasReset(key, messages)) forgetChat(key, messages);
    chatRt.loaded = true;
    chatRt.seen = messages.length;
    return addDelivered(key, messages);
  }

  function setConn(mode, detail) {
    const conn = $("#conn");
    conn.dataset.state = mode;
    $("#conn-label").textContent = { live: "live", polling: "polling", connecting: "connecting…", offline: "offline", idle: "idle" }[mode] || mode;
    conn.title = detail || { live: "Live: server-sent events", polling: "Polling every second (click to try live updates again)",
      offline: "Cannot reach the server (click to retry)", connecting: "Connecting…", idle: "" }[mode] || "";
  }

  function disconnect(key) {
    const chatRt = runtime.get(key);
    if (!chatRt) return;
    chatRt.generation++;
    if (chatRt.es) chatRt.es.abort();
    chatRt.es = null;
    clearTimeout(chatRt.timer);
    chatRt.timer = null;
    chatRt.mode = "idle";
  }

  async function connect(key) {
    disconnect(key);
    const chatRt = rt(key);
    const generation = chatRt.generation;
    setConn("connecting");
    try {
      await loadMessages(key);
    } catch (err) {
      if (generation !== chatRt.generation) return;
      setConn("offline", `Cannot load messages: ${err.message}`);
      chatRt.timer = setTimeout(() => connect(key), 3000);
      return;
    }
    if (generation !== chatRt.generation) return;
    chatRt.failures = 0;
    if (state.transport === "poll" || !canStream()) startPolling(key);
    else openStream(key);
  }

  function canStream() {
    return typeof fetch === "function" && typeof ReadableStream === "function" && typeof AbortController === "function";
  }

  /** Each event of a text/event-stream body, as it arrives: its type ("message" unless named) and
   *  its `data:` payload (comments are skipped). */
  async function readEvents(body, onEvent) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const lines = block.split("\n");
        const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        const named = lines.find((l) => l.startsWith("event:"));
        if (data) onEvent(named ? named.slice(6).trim() : "message", data);
      }
    }
  }

  function openStream(key) {
    const chatRt = rt(key);
    const generation = chatRt.generation;
    const [botId, chatId] = key.split("\u241f");
    const controller = new AbortController();
    chatRt.es = controller;
    chatRt.mode = "sse";
    chatRt.opened = false;
    const current = () => generation === chatRt.generation;
    const retry = () => {
      chatRt.es = null;
      chatRt.failures++;
      if (!chatRt.opened && chatRt.failures >= 2) {
        startPolling(key); // the stream does not work here (proxy, old browser, …)
        return;
      }
      if (key === state.chatKey) setConn("connecting", "Reconnecting to the live stream…");
      chatRt.brokeAt = chatRt.brokeAt || Date.now();
      const delay = Math.min(1000 * 2 ** (chatRt.failures - 1), 8000);
      chatRt.timer = setTimeout(async () => {
        if (!current()) return;
        // A restarted server may number the chat afresh: look at the chat before asking for what
        // comes after our last seq, or its new messages would all count as seen.
        try {
          await loadMessages(key);
        } catch (_) { /* the stream's own attempt says what is wrong */ }
        if (current()) openStream(key);
      }, delay);
    };
    (async () => {
      let res;
      try {
        res = await fetch(API.stream(botId, chatId, chatRt.lastSeq), { cache: "no-store", headers: authHeaders(), signal: controller.signal });
      } catch (_) {
        if (current()) retry();
        return;
      }
      if (!current()) return;
      if (res.status === 401) {
        chatRt.es = null;
        chatRt.mode = "idle";
        setConn("offline", "This bot needs a token (⚙ Settings)");
        showBanner("This console needs its bearer token: set it in ⚙ Settings.");
        return;
      }
      if (res.status === 429) {
        showBanner("Too many live viewers on this worker: polling instead.", "info");
        startPolling(key);
        return;
      }
      if (!res.ok || !res.body) {
        retry();
        return;
      }
      chatRt.opened = true;
      chatRt.failures = 0;
      chatRt.brokeAt = null;
      if (key === state.chatKey) setConn("live");
      try {
        await readEvents(res.body, (event, data) => {
          let msg;
          try {
            msg = JSON.parse(data);
          } catch (_) {
            return;
          }
          if (!current()) return;
          if (event === "note") applyNote(key, msg);
          else if (event === "message") addDelivered(key, [msg]);
        });
      } catch (_) { /* aborted, or the connection broke */ }
      // The server ended the stream (a restart, a slow tab) or the network did: reconnect from the
      // last seq we have.
      if (current()) retry();
    })();
  }

  function startPolling(key) {
    const chatRt = rt(key);
    const generation = chatRt.generation;
    if (chatRt.es) chatRt.es.abort();
    chatRt.es = null;
    chatRt.mode = "polling";
    if (key === state.chatKey) setConn("polling");
    let ticks = 0;
    const tick = async () => {
      if (generation !== chatRt.generation) return;
      if (state.transport !== "poll" && canStream() && ++ticks >= 30) {
        chatRt.failures = 0; // every 30 s, see whether the live stream works again
        openStream(key);
        return;
      }
      try {
        await loadMessages(key);
        if (key === state.chatKey) setConn("polling");
      } catch (err) {
        if (key === state.chatKey) setConn("offline", `Polling failed: ${err.message}`);
      }
      if (generation === chatRt.generation) chatRt.timer = setTimeout(tick, POLL_MS);
    };
    chatRt.timer = setTimeout(tick, POLL_MS);
  }

  async function backgroundPoll() {
    const others = state.chats.filter((c) => c.botId === state.botId && chatKeyOf(c.botId, c.id) !== state.chatKey).slice(0, 12);
    await Promise.all(others.map(async (c) => {
      const key = chatKeyOf(c.botId, c.id);
      const chatRt = rt(key);
      try {
        const body = await fetchJson(API.messages(c.botId, c.id), { headers: authHeaders() });
        const messages = Array.isArray(body && body.messages) ? body.messages : [];
        if (chatWasReset(key, messages)) forgetChat(key, messages);
        if (!chatRt.loaded) {
          // First look: what is already there counts as read.
          chatRt.loaded = true;
          for (const msg of messages) {
            chatRt.ids.add(msg.id);
            chatRt.delivered.push(msg);
            if (Number.isInteger(msg.seq) && msg.seq > chatRt.lastSeq) chatRt.lastSeq = msg.seq;
          }
          noteSeen(key);
          return;
        }
        addDelivered(key, messages);
      } catch (_) { /* the active chat shows connection problems */ }
    }));
    setTimeout(backgroundPoll, BACKGROUND_POLL_MS);
  }

  // ----------------------------------------------------------------------------------------------
  // Sending

  function showBanner(text, tone = "error") {
    const banner = $("#banner");
    banner.textContent = "";
    if (!text) {
      banner.hidden = true;
      return;
    }
    banner.dataset.tone = tone;
    banner.append(h("span", { text }), h("button", { type: "button", class: "icon-btn small", "aria-label": "Dismiss", text: "✕", onclick: () => showBanner(null) }));
    banner.hidden = false;
  }

  async function deliverLocal(key, m) {
    const chat = state.chats.find((c) => chatKeyOf(c.botId, c.id) === key);
    if (!chat) return;
    m.status = "sending";
    m.error = "";
    saveSent();
    if (key === state.chatKey) renderMessages();
    const payload = {
      chat_id: chat.id,
      chat_type: chat.type === "group" ? "group" : "private",
      user_id: m.userId,
      user_name: m.userName,
      text: m.text,
      message_id: m.id,
      mentions: m.mentions,
    };
    if (m.replyTo) payload.reply_to = m.replyTo;
    const headers = { "Content-Type": "application/json", ...authHeaders() };
    m.postedAt = Date.now();
    try {
      const answer = await fetchJson(API.webhook(chat.botId), { method: "POST", headers, body: JSON.stringify(payload) });
      m.status = "sent";
      // Whether the message reaches the agent (private, a trigger, a command), as the worker decided.
      if (answer && typeof answer.addressed === "boolean") m.addressed = answer.addressed;
      m.ackAt = Date.now();
    } catch (err) {
      m.status = "failed";
      m.error = err.status === 401 ? "401: this bot needs its token (⚙ Settings)" : err.message;
      if (err.status === 401) showBanner("The bot rejected the message: set its bearer token in ⚙ Settings.");
    }
    saveSent();
    if (key === state.chatKey) renderMessages();
  }

  function sendText(text, { useComposer = false, confirms = null } = {}) {
    const user = currentUser();
    const chat = currentChat();
    if (!chat) {
      showBanner("Create or pick a chat first.", "info");
      return false;
    }
    if (!user) {
      showBanner("Add a user first (+ User in the sidebar).", "info");
      return false;
    }
    // Mentions: the chips, then each known id typed `@id` in the text (a mention in its place).
    const mentions = useComposer ? [...new Set([...composer.mentions, ...typedMentions(text)])] : [];
    const replyTo = useComposer ? composer.replyTo : null;
    if (!text.trim() && !mentions.length) return false;
    const key = chatKeyOf(chat.botId, chat.id);
    const m = { id: newId("web"), userId: user.id, userName: user.name || user.id, text, mentions,
      replyTo, sentAt: Date.now(), status: "sending" };
    // An /allow or /deny answers the card it was clicked on, else the newest confirmation here.
    if (ANSWER.test(text)) m.confirms = confirms || latestConfirmation(key);
    (state.sent[key] = state.sent[key] || []).push(m);
    if (useComposer) {
      composer.mentions = [];
      closeSuggest();
      setReplyTo(null, { render: false });
      renderComposer();
    }
    renderMessages({ forceBottom: true });
    deliverLocal(key, m);
    return true;
  }

  function sendFromComposer() {
    const input = $("#input");
    if (sendText(input.value, { useComposer: true })) {
      input.value = "";
      autoGrow();
    }
    input.focus();
  }

  // ----------------------------------------------------------------------------------------------
  // Composer: mentions, reply-to, sender

  function setReplyTo(id, { render = true } = {}) {
    composer.replyTo = id;
    const bar = $("#reply-bar");
    if (id) {
      const ref = findMessage(id);
      $("#reply-bar-text").textContent = ref ? `${ref.author}: ${ref.snippet || "(no text)"}` : id;
      bar.hidden = false;
      $("#input").focus();
    } else {
      bar.hidden = true;
    }
    if (render) renderMessages();
  }

  function toggleMention(target) {
    const i = composer.mentions.indexOf(target);
    if (i >= 0) composer.mentions.splice(i, 1);
    else composer.mentions.push(target);
    renderComposer();
  }

  function renderComposer() {
    const bar = $("#mention-bar");
    bar.textContent = "";
    const bot = currentBot();
    for (const target of composer.mentions) {
      const user = userById(target);
      const isBot = bot && bot.self_id === target;
      bar.append(h("span", { class: `mention-chip removable${isBot ? " bot" : ""}`, dataset: { target, testid: "mention-chip" } },
        `@${target}`, user && user.name !== target ? h("span", { class: "mention-name", text: user.name }) : null,
        h("button", { type: "button", class: "chip-x", "aria-label": `Remove @${target}`, text: "×", onclick: () => toggleMention(target) })));
    }
    bar.hidden = composer.mentions.length === 0;
    const botBtn = $("#mention-bot");
    const selfId = bot && bot.self_id;
    botBtn.disabled = !selfId;
    botBtn.textContent = selfId ? `@${selfId}` : "@bot";
    botBtn.title = selfId ? `Mention the bot (${selfId})` : "This bot has no self_id to mention";
    botBtn.setAttribute("aria-pressed", String(!!selfId && composer.mentions.includes(selfId)));
    const chat = currentChat();
    const disabled = !chat || !currentUser();
    $("#send").disabled = disabled;
    $("#input").disabled = !chat;
    // Short enough for a phone; the rest is in the title (a clipped placeholder reads as a value).
    const input = $("#input");
    input.placeholder = !chat ? "Create a chat to start" : chat.type === "group" ? "Message the group…" : "Message the bot…";
    input.title = !chat ? "" : chat.type === "group"
      ? "In a group, @mention the bot (type @ to pick) or reply to it to reach it · Enter to send, Shift+Enter for a new line"
      : "Enter to send, Shift+Enter for a new line · type @ to mention someone";
    for (const b of document.querySelectorAll(".composer-tools .cmd")) b.disabled = disabled;
  }

  function renderMentionMenu() {
    const menu = $("#mention-menu");
    menu.textContent = "";
    const options = mentionables().filter((o) => o.id !== state.userId);
    if (!options.length) menu.append(h("div", { class: "menu-empty", text: "Add more users to mention them" }));
    for (const o of options) {
      const on = composer.mentions.includes(o.id);
      menu.append(h("button", { type: "button", role: "menuitemcheckbox", "aria-checked": String(on), class: `menu-item${on ? " on" : ""}`,
        dataset: { target: o.id, testid: "mention-option" }, onclick: () => { toggleMention(o.id); closeMentionMenu(); } },
      avatar(o.name, o.seed, o.bot ? "sm bot" : "sm"), h("span", { class: "menu-name", text: o.name }),
      o.bot ? h("span", { class: "bot-badge", text: "BOT" }) : null, h("span", { class: "menu-id", text: `@${o.id}` })));
    }
  }

  // Typing `@…` opens the members whose id or name starts with what follows (the bot first); the
  // arrow keys move, Enter or Tab (or a click) writes `@id ` in its place: a mention when sent.
  const TYPING_MENTION = /(?:^|[^\p{L}\p{N}_@.])@([\p{L}\p{N}_.-]*)$/u;

  function updateSuggest() {
    const input = $("#input");
    const caret = input.selectionStart;
    const typed = caret === input.selectionEnd ? input.value.slice(0, caret).match(TYPING_MENTION) : null;
    const query = typed ? typed[1].toLowerCase() : "";
    const items = typed ? mentionables().filter((o) => o.id !== state.userId &&
      (o.id.toLowerCase().startsWith(query) || String(o.name || "").toLowerCase().startsWith(query))) : [];
    if (!items.length) {
      closeSuggest();
      return;
    }
    const start = caret - typed[1].length - 1;
    const kept = composer.suggest && composer.suggest.start === start ? composer.suggest.index : 0;
    composer.suggest = { start, end: caret, items, index: Math.min(kept, items.length - 1) };
    renderSuggest();
  }

  function renderSuggest() {
    const list = $("#mention-suggest");
    list.textContent = "";
    const { items, index } = composer.suggest;
    items.forEach((o, i) => {
      list.append(h("button", { type: "button", role: "option", "aria-selected": String(i === index), class: `menu-item${i === index ? " on" : ""}`,
        dataset: { target: o.id, testid: "mention-suggestion" }, tabindex: "-1",
        onmousedown: (ev) => ev.preventDefault(), // keep the caret in the text
        onclick: () => pickSuggestion(i) },
      avatar(o.name, o.seed, o.bot ? "sm bot" : "sm"), h("span", { class: "menu-name", text: o.name }),
      o.bot ? h("span", { class: "bot-badge", text: "BOT" }) : null, h("span", { class: "menu-id", text: `@${o.id}` })));
    });
    list.hidden = false;
    $("#input").setAttribute("aria-expanded", "true");
  }

  /** Text put in the message at the caret (a directive from the cheat-sheet). */
  function insertText(text) {
    const input = $("#input");
    if (input.disabled) return;
    const start = input.selectionStart ?? input.value.length;
    const end = input.selectionEnd ?? start;
    input.value = input.value.slice(0, start) + text + input.value.slice(end);
    input.setSelectionRange(start + text.length, start + text.length);
    autoGrow();
    closeSidebar();
    input.focus();
  }

  function pickSuggestion(i) {
    const suggest = composer.suggest;
    const choice = suggest && suggest.items[i];
    if (!choice) return;
    const input = $("#input");
    const written = `@${choice.id} `;
    input.value = input.value.slice(0, suggest.start) + written + input.value.slice(suggest.end);
    const caret = suggest.start + written.length;
    input.setSelectionRange(caret, caret);
    closeSuggest();
    autoGrow();
    input.focus();
  }

  /** Keys while suggestions are open; true when the key was theirs. */
  function suggestKey(ev) {
    const suggest = composer.suggest;
    if (!suggest) return false;
    if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
      const step = ev.key === "ArrowDown" ? 1 : -1;
      suggest.index = (suggest.index + step + suggest.items.length) % suggest.items.length;
      renderSuggest();
    } else if ((ev.key === "Enter" || ev.key === "Tab") && !ev.shiftKey && !ev.isComposing) {
      pickSuggestion(suggest.index);
    } else if (ev.key === "Escape") {
      closeSuggest();
    } else {
      return false;
    }
    ev.preventDefault();
    return true;
  }

  function closeSuggest() {
    composer.suggest = null;
    const list = $("#mention-suggest");
    list.hidden = true;
    list.textContent = "";
    $("#input").setAttribute("aria-expanded", "false");
  }

  function closeMentionMenu() {
    $("#mention-menu").hidden = true;
    $("#mention-users").setAttribute("aria-expanded", "false");
  }

  function autoGrow() {
    const input = $("#input");
    input.style.height = "auto";
    input.style.height = `${Math.min(input.scrollHeight, 180)}px`;
  }

  // ----------------------------------------------------------------------------------------------
  // Sidebar: bots, chats, users

  function renderBots() {
    const select = $("#bot-select");
    select.textContent = "";
    for (const b of state.bots) select.append(h("option", { value: b.bot_id, text: b.bot_id }));
    select.value = state.botId || "";
    $("#bot-picker").classList.toggle("single", state.bots.length <= 1);
    const bot = currentBot();
    const meta = $("#bot-meta");
    meta.textContent = "";
    if (bot) {
      meta.append(avatar(bot.bot_id, `bot:${bot.bot_id}`, "bot sm"),
        h("span", { class: "bot-name", text: bot.bot_id }),
        bot.self_id ? h("span", { class: "pill", title: "self_id: mention this to trigger the bot in groups", text: `@${bot.self_id}` }) : null,
        bot.language ? h("span", { class: "pill", title: "language", text: bot.language }) : null,
        bot.busy_policy ? h("span", { class: "pill", title: "busy policy", text: bot.busy_policy }) : null);
    } else {
      meta.append(h("span", { class: "muted", text: "No console bot configured" }));
    }
  }

  function renderChatList() {
    const list = $("#chat-list");
    list.textContent = "";
    const chats = state.chats.filter((c) => c.botId === state.botId);
    if (!chats.length) list.append(h("li", { class: "list-empty", text: "No chats yet" }));
    for (const c of chats) {
      const key = chatKeyOf(c.botId, c.id);
      const chatRt = runtime.get(key);
      const active = key === state.chatKey;
      list.append(h("li", { class: `chat-item${active ? " active" : ""}`, dataset: { chat: c.id, type: c.type } },
        h("button", { type: "button", class: "chat-open", "aria-current": active ? "true" : undefined, onclick: () => selectChat(key) },
          h("span", { class: `chat-icon ${c.type}`, "aria-hidden": "true" }, icon(c.type === "group" ? "users" : "user")),
          h("span", { class: "chat-text" }, h("span", { class: "chat-label", text: c.name || c.id }),
            h("span", { class: "chat-id", text: `${c.type} · ${c.id}` })),
          chatRt && chatRt.unread && !active ? h("span", { class: "badge", text: String(chatRt.unread) }) : null),
        h("button", { type: "button", class: "icon-btn small row-action", title: "Remove from this list", "aria-label": `Remove chat ${c.id}`,
          text: "✕", onclick: () => removeChat(key) })));
    }
  }

  function renderUsers() {
    const list = $("#user-list");
    list.textContent = "";
    if (!state.users.length) list.append(h("li", { class: "list-empty", text: "No users yet" }));
    for (const u of state.users) {
      const active = u.id === state.userId;
      list.append(h("li", { class: `user-item${active ? " active" : ""}`, dataset: { user: u.id } },
        h("button", { type: "button", class: "user-open", title: `Send as ${u.name}`, "aria-pressed": String(active), onclick: () => selectUser(u.id) },
          avatar(u.name, u.id, "sm"),
          h("span", { class: "user-text" }, h("span", { class: "user-label", text: u.name }), h("span", { class: "user-id", text: u.id })),
          isAdmin(u.id) ? h("span", { class: "admin-badge", text: "admin" }) : null,
          active ? h("span", { class: "you", text: "current" }) : null),
        h("button", { type: "button", class: "icon-btn small row-action", title: "Edit", "aria-label": `Edit user ${u.id}`, text: "✎", onclick: () => openUserDialog(u) }),
        h("button", { type: "button", class: "icon-btn small row-action", title: "Remove", "aria-label": `Remove user ${u.id}`, text: "✕", onclick: () => removeUser(u.id) })));
    }
    const select = $("#sender-select");
    select.textContent = "";
    for (const u of state.users) select.append(h("option", { value: u.id, text: `${u.name}${isAdmin(u.id) ? " ★" : ""}` }));
    select.value = state.userId || "";
    const sa = $("#sender-avatar");
    const cu = currentUser();
    sa.textContent = cu ? (cu.name.trim()[0] || "?").toUpperCase() : "?";
    sa.style.setProperty("--h", String(hue(cu ? cu.id : "")));
  }

  function renderHeader() {
    const chat = currentChat();
    $("#chat-name").textContent = chat ? chat.name || chat.id : "No chat selected";
    const sub = $("#chat-sub");
    sub.textContent = "";
    if (chat) {
      sub.append(h("span", { class: `type-badge ${chat.type}`, text: chat.type }), h("span", { text: ` ${chat.id}` }),
        h("span", { class: "muted", text: ` · ${chat.botId}` }));
    }
    if (chat) sub.append(h("span", { class: "muted usage-line", "data-testid": "usage-line", text: usageLine(state.chatKey) }));
    document.title = chat ? `${chat.name || chat.id} · Switchboard console` : "Switchboard console";
  }

  // Usage budgets: the chat's, the sender's and the bot's totals in the current window (one line).
  const usageByChat = new Map();
  function usageLine(key) {
    const u = usageByChat.get(key);
    if (!u || u.accounted === false) return "";  // a bot without budgets is not accounted
    const part = (label, s) => {
      if (!s) return null;
      const cap = s.limit_tokens != null ? `/${s.limit_tokens + (s.granted_tokens || 0)}` : "";
      return `${label} ${s.tokens}${cap} tok, ${Math.round(s.active_seconds)} s`;
    };
    const parts = [part("chat", u.chat), part("you", u.user), part("bot", u.bot)].filter(Boolean);
    return ` · usage ${u.window}: ${parts.join(" · ")}`;
  }
  async function refreshUsage(key) {
    const [botId, chatId] = key.split("\u241f");
    try {
      const body = await fetchJson(API.usage(botId, chatId, state.userId), { headers: authHeaders() });
      usageByChat.set(key, body);
      if (key === state.chatKey) renderHeader();
    } catch (_) { /* usage is a nicety: the chat works without it */ }
  }

  function renderAll() {
    renderBots();
    renderChatList();
    renderUsers();
    renderHeader();
    renderComposer();
    renderMessages();
  }

  function selectChat(key) {
    if (state.chatKey && state.chatKey !== key) disconnect(state.chatKey);
    state.chatKey = key;
    saveState();
    composer.replyTo = null;
    $("#reply-bar").hidden = true;
    rt(key).unread = 0;
    closeSidebar();
    renderChatList();
    renderHeader();
    renderComposer();
    renderMessages({ forceBottom: true });
    connect(key);
  }

  function selectUser(id) {
    state.userId = id;
    saveState();
    composer.mentions = composer.mentions.filter((m) => m !== id);
    renderUsers();
    renderComposer();
    renderMessages();
  }

  function addChat(type, id, name) {
    const key = chatKeyOf(state.botId, id);
    const existing = state.chats.find((c) => chatKeyOf(c.botId, c.id) === key);
    if (existing) {
      if (name) existing.name = name;
      existing.type = type;
    } else {
      state.chats.push({ botId: state.botId, id, type, name: name || "" });
    }
    saveState();
    selectChat(key);
  }

  function removeChat(key) {
    const chat = state.chats.find((c) => chatKeyOf(c.botId, c.id) === key);
    if (!chat || !window.confirm(`Remove “${chat.name || chat.id}” from this console? (The bot's history stays on the server.)`)) return;
    disconnect(key);
    runtime.delete(key);
    state.chats = state.chats.filter((c) => c !== chat);
    delete state.sent[key];
    delete state.seen[key];
    saveSent();
    if (state.chatKey === key) {
      const next = state.chats.find((c) => c.botId === state.botId);
      state.chatKey = next ? chatKeyOf(next.botId, next.id) : null;
      if (next) selectChat(state.chatKey);
    }
    saveState();
    renderAll();
    if (!state.chatKey) setConn("idle");
  }

  function saveUser(id, name, originalId) {
    const existing = state.users.find((u) => u.id === (originalId || id));
    if (existing) Object.assign(existing, { id, name: name || id });
    else state.users.push({ id, name: name || id });
    if (!originalId || state.userId === originalId) state.userId = id;
    saveState();
    renderUsers();
    renderComposer();
    renderMessages();
  }

  function removeUser(id) {
    const user = userById(id);
    if (!user || !window.confirm(`Remove user “${user.name}”?`)) return;
    state.users = state.users.filter((u) => u !== user);
    if (state.userId === id) state.userId = state.users.length ? state.users[0].id : null;
    saveState();
    renderUsers();
    renderComposer();
    renderMessages();
  }

  function switchBot(botId) {
    if (state.chatKey) disconnect(state.chatKey);
    state.botId = botId;
    const first = state.chats.find((c) => c.botId === botId);
    state.chatKey = first ? chatKeyOf(first.botId, first.id) : null;
    composer.mentions = [];
    saveState();
    renderAll();
    if (state.chatKey) selectChat(state.chatKey);
    else setConn("idle");
  }

  // ----------------------------------------------------------------------------------------------
  // Dialogs

  function openChatDialog(type) {
    const dialog = $("#chat-dialog");
    const form = $("#chat-form");
    form.reset();
    form.elements.chat_type.value = type;
    const suggest = () => {
      const t = form.elements.chat_type.value;
      const user = currentUser();
      const n = state.chats.filter((c) => c.type === t).length + 1;
      const fallback = t === "group" ? `group-${n}` : `dm-${user ? user.id : n}`;
      // A suggestion, not a value: the field stays empty (and says what empty means).
      $("#chat-id-input").placeholder = `e.g. ${fallback}`;
      $("#chat-id-input").dataset.fallback = fallback;
      $("#chat-id-hint").textContent = `Leave empty to use ${fallback}.`;
      $("#chat-dialog-title").textContent = t === "group" ? "New group chat" : "New private chat";
    };
    suggest();
    for (const r of form.elements.chat_type) r.onchange = suggest;
    dialog.showModal();
    $("#chat-id-input").focus();
  }

  function openUserDialog(user) {
    const dialog = $("#user-dialog");
    const form = $("#user-form");
    form.reset();
    form.dataset.original = user ? user.id : "";
    $("#user-dialog-title").textContent = user ? "Edit user" : "Add user";
    if (user) {
      form.elements.user_id.value = user.id;
      form.elements.user_name.value = user.name;
    }
    form.elements.user_id.placeholder = `user${state.users.length + 1}`;
    dialog.showModal();
    $("#user-id-input").focus();
  }

  function wireDialogs() {
    for (const btn of document.querySelectorAll("dialog [data-close]")) btn.addEventListener("click", () => btn.closest("dialog").close("cancel"));
    for (const dialog of document.querySelectorAll("dialog")) {
      dialog.addEventListener("click", (ev) => { if (ev.target === dialog) dialog.close("cancel"); }); // backdrop
    }
    $("#chat-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const form = ev.currentTarget;
      const id = form.elements.chat_id.value.trim() || form.elements.chat_id.dataset.fallback || "";
      if (!id) return;
      $("#chat-dialog").close("ok");
      addChat(form.elements.chat_type.value === "group" ? "group" : "private", id, form.elements.chat_name.value.trim());
    });
    $("#user-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const form = ev.currentTarget;
      const id = form.elements.user_id.value.trim() || form.elements.user_id.placeholder;
      if (!id) return;
      const original = form.dataset.original || "";
      if (!original && userById(id) && !window.confirm(`User “${id}” exists. Update it?`)) return;
      $("#user-dialog").close("ok");
      saveUser(id, form.elements.user_name.value.trim(), original || (userById(id) ? id : ""));
    });
    $("#settings-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const form = ev.currentTarget;
      const token = form.elements.token.value.trim();
      const transport = form.elements.transport.value === "poll" ? "poll" : "auto";
      const changed = token !== state.token || transport !== state.transport;
      state.token = token;
      state.transport = transport;
      saveState();
      $("#settings-dialog").close("ok");
      showBanner(null);
      if (changed && state.chatKey) connect(state.chatKey);
    });
    $("#reset-all").addEventListener("click", () => {
      if (!window.confirm("Forget all chats, users, tokens and sent messages kept by this console?")) return;
      localStorage.removeItem(LS_KEY);
      sessionStorage.removeItem(SS_KEY);
      location.reload();
    });
  }

  // ----------------------------------------------------------------------------------------------
  // Wiring

  function openSidebar() {
    $("#app").classList.add("sidebar-open");
    $("#scrim").hidden = false;
  }

  function closeSidebar() {
    $("#app").classList.remove("sidebar-open");
    $("#scrim").hidden = true;
  }

  function wire() {
    wireDialogs();
    $("#new-private").addEventListener("click", () => openChatDialog("private"));
    $("#new-group").addEventListener("click", () => openChatDialog("group"));
    $("#new-user").addEventListener("click", () => openUserDialog(null));
    $("#open-settings").addEventListener("click", () => {
      const form = $("#settings-form");
      form.elements.token.value = state.token;
      form.elements.transport.value = state.transport;
      $("#settings-dialog").showModal();
    });
    $("#bot-select").addEventListener("change", (ev) => switchBot(ev.target.value));
    $("#sender-select").addEventListener("change", (ev) => selectUser(ev.target.value));
    $("#menu-btn").addEventListener("click", openSidebar);
    $("#sidebar-close").addEventListener("click", closeSidebar);
    $("#scrim").addEventListener("click", closeSidebar);
    $("#conn").addEventListener("click", () => {
      if (!state.chatKey) return;
      const chatRt = rt(state.chatKey);
      if (chatRt.mode !== "sse" || !chatRt.opened) connect(state.chatKey);
    });
    $("#clear-local").addEventListener("click", () => {
      if (!state.chatKey || !(state.sent[state.chatKey] || []).length) return;
      if (!window.confirm("Forget the messages sent from this tab in this chat? The bot's messages stay.")) return;
      delete state.sent[state.chatKey];
      saveSent();
      renderMessages();
    });
    $("#reply-cancel").addEventListener("click", () => setReplyTo(null));
    for (const btn of document.querySelectorAll("#directives [data-insert]")) {
      btn.addEventListener("click", () => insertText(`${btn.dataset.insert} `));
    }
    $("#send").addEventListener("click", sendFromComposer);
    const input = $("#input");
    input.addEventListener("input", () => {
      autoGrow();
      updateSuggest();
    });
    input.addEventListener("click", updateSuggest);
    input.addEventListener("blur", closeSuggest);
    input.addEventListener("keyup", (ev) => {
      if (["ArrowLeft", "ArrowRight", "Home", "End"].includes(ev.key)) updateSuggest();
    });
    input.addEventListener("keydown", (ev) => {
      if (suggestKey(ev)) return;
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        sendFromComposer();
      } else if (ev.key === "Escape" && composer.replyTo) {
        setReplyTo(null);
      }
    });
    $("#mention-bot").addEventListener("click", () => {
      const bot = currentBot();
      if (bot && bot.self_id) toggleMention(bot.self_id);
    });
    $("#mention-users").addEventListener("click", (ev) => {
      ev.stopPropagation();
      const menu = $("#mention-menu");
      if (!menu.hidden) {
        closeMentionMenu();
        return;
      }
      renderMentionMenu();
      menu.hidden = false;
      ev.currentTarget.setAttribute("aria-expanded", "true");
    });
    document.addEventListener("click", (ev) => {
      if (!ev.target.closest(".mention-menu-wrap")) closeMentionMenu();
    });
    for (const btn of document.querySelectorAll(".composer-tools .cmd")) {
      btn.addEventListener("click", () => sendText(btn.dataset.command));
    }
    $("#lightbox").addEventListener("click", () => {
      $("#lightbox").hidden = true;
      $("#lightbox-img").removeAttribute("src");
    });
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape") {
        $("#lightbox").hidden = true;
        closeMentionMenu();
      }
    });
  }

  async function loadConfig() {
    try {
      const body = await fetchJson(API.config, { headers: authHeaders() });
      state.bots = Array.isArray(body && body.bots) ? body.bots : [];
      showBanner(null);
      return true;
    } catch (err) {
      if (err.status === 401) {
        showBanner("This console needs its bearer token: enter it in ⚙ Settings (or open the page as /console/#token=…).");
        const dialog = $("#settings-dialog");
        if (!dialog.open) $("#open-settings").click();
      } else {
        showBanner(`Cannot load the console configuration: ${err.message}. Retrying…`);
      }
      return false;
    }
  }

  async function start() {
    loadState();
    wire();
    while (!(await loadConfig())) await new Promise((r) => setTimeout(r, 3000));
    if (!state.bots.some((b) => b.bot_id === state.botId)) state.botId = state.bots.length ? state.bots[0].bot_id : null;
    if (!state.bots.length) {
      showBanner("No bot of platform “console” is configured on this worker: add one to the settings to chat here.", "info");
    }
    if (!state.users.length) {
      state.users.push({ id: "alice", name: "Alice" });
      state.userId = "alice";
    }
    if (!userById(state.userId)) state.userId = state.users[0].id;
    if (state.botId && !state.chats.some((c) => c.botId === state.botId)) {
      state.chats.push({ botId: state.botId, id: `dm-${state.userId}`, type: "private", name: `${currentUser().name} ↔ bot` });
    }
    if (!state.chats.some((c) => chatKeyOf(c.botId, c.id) === state.chatKey && c.botId === state.botId)) {
      const first = state.chats.find((c) => c.botId === state.botId);
      state.chatKey = first ? chatKeyOf(first.botId, first.id) : null;
    }
    saveState();
    renderAll();
    if (state.chatKey) selectChat(state.chatKey);
    setTimeout(backgroundPoll, BACKGROUND_POLL_MS);
    document.documentElement.dataset.ready = "true";
  }

  // Exposed for tests and the curious (read-only helpers).
  window.SwitchboardConsole = { renderMarkdown, sniffBase64, state, runtime };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
