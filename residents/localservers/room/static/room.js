/* The room's web page: messages as Discord shows them, each with its kind from
 * /_room/annotations, a box to post as a person, and a moderator panel that runs slash
 * commands through POST /_room/commands. Live through the /_room/events SSE stream.
 * A room built from a layout has several guilds: a selector picks one, and channels are
 * named guild/channel in the address. Where a script plays in the room (the demo), the header
 * shows its progress and a "Play again" control, and its moderator's answers appear in the panel.
 * A bot's buttons show under its message; pressing one acts as the person named in the message box,
 * and its (ephemeral) answer appears in the panel.
 * Narrow screens keep the chat: channels become a drawer and the panel a sheet below it. */
"use strict";

const $ = (sel) => document.querySelector(sel);
const GROUP_MS = 7 * 60 * 1000;          // Discord groups a sender's messages within 7 minutes
const NEAR_BOTTOM_PX = 80;               // this close to the end counts as reading the latest
const KIND_RETRIES = [300, 800, 2000, 5000];  // the ledger records a post just after it is sent
// A message still live is asked again until it settles: a partial that filled up is not edited again
// when its generation settles, so no event would tell the page. Quick at first, then every 5 s.
const LIVE_RECHECK_MS = [500, 1000, 2000, 5000];

const room = {
  state: null,           // GET /_room/state
  guild: null,           // the guild shown (its name)
  channelId: null,
  names: new Map(),      // user id -> name
  messages: [],          // room views of the current channel, oldest first
  kinds: new Map(),      // message id -> {kind, generation_id, ...} from the annotator
  tries: new Map(),      // message id -> annotation lookups so far
  liveChecks: new Map(), // message id -> lookups that still found it live
  shownCommands: new Set(),  // "run:index" of the demo moderator's answers already in the panel
  pending: new Set(),
  flushTimer: null,
  typing: new Map(),     // name -> timer
  unseen: 0,             // messages that arrived below while the reader was scrolled up
  stick: true,           // the reader is at the latest message: keep them there as things change
};

async function api(method, path, body) {
  const resp = await fetch(path, {
    method, headers: body ? {"Content-Type": "application/json"} : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.message || `${resp.status} ${resp.statusText}`);
  return data;
}

/* ----- state: channels, members ---------------------------------------------------------- */

async function loadState() {
  room.state = await api("GET", "/_room/state");
  if (!room.guild || !guildOf(room.guild)) room.guild = room.state.guilds[0].name;
  for (const u of [...room.state.bots, ...room.state.people]) room.names.set(u.id, u.name);
  renderGuilds();
  renderChannels();
  renderMembers();
  renderBotPicker();
  renderModNames();
  renderShow(room.state.show);
}

const multiGuild = () => room.state.guilds.length > 1;
const guildOf = (name) => room.state.guilds.find((g) => g.name === name);
const channelHash = (c) => (multiGuild() ? c.ref : c.name);

function renderGuilds() {
  $("#guild").textContent = room.guild;
  const select = $("#guild-select");
  select.hidden = !multiGuild();
  select.replaceChildren(...room.state.guilds.map((g) => Object.assign(document.createElement("option"),
    {value: g.name, textContent: g.name})));
  select.value = room.guild;
}

function renderChannels() {
  const ul = $("#channels");
  ul.replaceChildren(...room.state.channels.filter((c) => c.guild === room.guild).map((c) => {
    const li = document.createElement("li");
    const a = document.createElement("a");
    a.href = `#${channelHash(c)}`;
    a.textContent = c.name;
    a.dataset.channelId = c.id;
    a.className = c.id === room.channelId ? "active" : "";
    a.addEventListener("click", (ev) => { ev.preventDefault(); closeSide(); openChannel(c.id); });
    li.append(a);
    return li;
  }));
}

function renderMembers() {
  const bots = new Map(room.state.bots.map((b) => [b.name, b]));
  const items = guildOf(room.guild).members.map((m) => ({
    name: m.name, bot: m.bot, on: m.bot ? Boolean(bots.get(m.name) && bots.get(m.name).connected) : true,
    roles: m.roles.filter((r) => r !== "bots"),
  }));
  $("#members").replaceChildren(...items.map((m) => {
    const li = document.createElement("li");
    li.className = m.on ? "online" : "offline";
    li.append(avatar(m.name, m.bot), Object.assign(document.createElement("span"), {textContent: m.name}));
    if (m.bot) li.append(botTag());
    if (m.roles.length) li.title = m.roles.join(", ");
    return li;
  }));
}

/* Who the panel may act as: the guild's people, those whose roles let them moderate first. */
function renderModNames() {
  const g = guildOf(room.guild);
  const strong = new Set(g.roles.filter((r) => r.permissions.includes("manage_messages")
    || r.permissions.includes("administrator")).map((r) => r.name));
  const people = g.members.filter((m) => !m.bot);
  const mods = people.filter((m) => m.roles.some((r) => strong.has(r)));
  $("#mod-members").replaceChildren(...[...mods, ...people.filter((m) => !mods.includes(m))].map((m) =>
    Object.assign(document.createElement("option"), {value: m.name})));
  const input = $("#mod-name");
  if (!hasModeratorRole() && mods.length && !people.some((m) => m.name === input.value)) input.value = mods[0].name;
}

/* The default room's shortcut: its `moderator` role is given to whoever the panel acts as. */
const hasModeratorRole = () => guildOf(room.guild).roles.some((r) => r.name === "moderator");

function renderBotPicker() {
  const select = $("#mod-bot");
  const previous = select.value;
  // Residents, whichever bot has the commands: one bot answers for every resident of its process.
  select.replaceChildren(...room.state.bots.map((b) => {
    const opt = document.createElement("option");
    opt.value = b.name;
    opt.textContent = b.name + (b.connected ? "" : " (offline)");
    return opt;
  }));
  if (previous && [...select.options].some((o) => o.value === previous)) select.value = previous;
}

let stateTimer = null;
function refreshStateSoon() {
  clearTimeout(stateTimer);
  stateTimer = setTimeout(() => loadState().catch(showConnError), 200);
}

/* ----- messages ------------------------------------------------------------------------------ */

async function openChannel(id) {
  room.channelId = id;
  const ch = room.state.channels.find((c) => c.id === id);
  if (ch && ch.guild !== room.guild) {
    room.guild = ch.guild;
    renderGuilds();
    renderMembers();
    renderModNames();
  }
  $("#channel-name").textContent = ch ? ch.name : id;
  $("#content").placeholder = `Message #${ch ? ch.name : ""}` + (narrow() ? "" : " — @name mentions a resident");
  history.replaceState(null, "", `#${ch ? channelHash(ch) : id}`);
  renderChannels();
  room.messages = [];  // events that arrive while the history loads are merged, not lost
  const fetched = await api("GET", `/_room/channels/${id}/messages`);
  if (room.channelId !== id) return;
  const have = new Set(fetched.map((m) => m.id));
  room.messages = fetched.concat(room.messages.filter((m) => m.channel_id === id && !have.has(m.id)));
  for (const m of room.messages) room.names.set(m.author_id, m.author);
  renderMessages();
  for (const m of room.messages) wantKind(m.id);
}

function renderMessages() {
  const list = $("#messages");
  list.replaceChildren(...room.messages.map((m, i) => messageItem(m, room.messages[i - 1])));
  list.scrollTop = list.scrollHeight;
  room.unseen = 0;
  onScroll();
}

/* ----- reading position: new-message indicator, jump to latest, kept across layout changes ------- */

function nearBottom(list) { return list.scrollHeight - list.scrollTop - list.clientHeight < NEAR_BOTTOM_PX; }

function onScroll() {
  const list = $("#messages");
  room.stick = nearBottom(list);
  if (room.stick) room.unseen = 0;
  renderJump();
}

function renderJump() {
  const jump = $("#jump");
  jump.hidden = room.stick;
  jump.textContent = room.unseen
    ? `${room.unseen} new message${room.unseen === 1 ? "" : "s"} · Jump to latest ↓` : "Jump to latest ↓";
}

function jumpToLatest() {
  const list = $("#messages");
  list.scrollTop = list.scrollHeight;
  onScroll();
  $("#content").focus();
}

/* Run `change` (which reflows the list: a panel opening, a sheet) keeping what the reader sees: the
 * latest message if they were there, else the message at the top of the view, at the same offset. */
function keepReading(change) {
  const list = $("#messages");
  const top = list.getBoundingClientRect().top;
  const anchor = room.stick ? null : [...list.children].find((li) => li.getBoundingClientRect().bottom > top);
  const offset = anchor ? anchor.getBoundingClientRect().top - top : 0;
  change();
  if (anchor) list.scrollTop += anchor.getBoundingClientRect().top - list.getBoundingClientRect().top - offset;
  else list.scrollTop = list.scrollHeight;
  onScroll();
}

function grouped(m, prev) {
  return prev && prev.author_id === m.author_id && !m.reply_to && !m.interaction
    && Date.parse(m.timestamp) - Date.parse(prev.timestamp) < GROUP_MS;
}

function messageItem(m, prev) {
  const li = document.createElement("li");
  li.className = "msg";
  li.dataset.id = m.id;
  li.dataset.author = m.author;
  if (grouped(m, prev)) li.classList.add("cont");
  else {
    const head = document.createElement("div");
    head.className = "head";
    const name = Object.assign(document.createElement("span"), {className: "author", textContent: m.author});
    head.append(name);
    if (m.bot) head.append(botTag());
    head.append(timeEl(m.timestamp, true));
    li.append(avatar(m.author, m.bot), head);
  }
  li.append(Object.assign(timeEl(m.timestamp, false), {className: "gutter-time"}));
  if (m.reply_to) {
    const ref = room.messages.find((x) => x.id === m.reply_to);
    const quote = document.createElement("div");
    quote.className = "replying";
    quote.textContent = ref ? `↱ @${ref.author}: ${ref.content.slice(0, 80)}` : "↱ original message was deleted";
    li.insertBefore(quote, li.firstChild);
  }
  const body = document.createElement("div");
  body.className = "body";
  body.innerHTML = RoomMarkdown.render(m.content, {names: nameOf, channels: channelName});
  if (m.edited_timestamp) body.insertAdjacentHTML("beforeend", ' <span class="edited">(edited)</span>');
  for (const a of m.attachments || []) {
    const image = /^image\/(png|jpeg|gif|webp)\b/.test(a.content_type || "")
      ? `<img class="thumb" src="${RoomMarkdown.esc(a.url)}" alt="${RoomMarkdown.esc(a.filename)}">` : "";
    body.insertAdjacentHTML("beforeend",
      `<div class="attachment">${image}<a href="${RoomMarkdown.esc(a.url)}">${RoomMarkdown.esc(a.filename)}</a> · ${a.size} bytes</div>`);
  }
  for (const e of m.embeds || []) {
    body.insertAdjacentHTML("beforeend", `<div class="embed">${e.title ? `<strong>${RoomMarkdown.esc(e.title)}</strong>` : ""}${
      e.description ? RoomMarkdown.render(e.description, {names: nameOf, channels: channelName}) : ""}</div>`);
  }
  if (m.loading) body.insertAdjacentHTML("beforeend", '<span class="thinking">is thinking…</span>');
  li.append(body);
  const rows = (m.components || []).filter((r) => (r.components || []).length);
  if (rows.length) li.append(componentsOf(m, rows));
  const mark = document.createElement("button");
  mark.type = "button";
  mark.className = "kind-mark";
  mark.addEventListener("click", () => {
    const k = room.kinds.get(m.id);
    if (k && k.generation_id) { openPanel(); runGenerationShow(k.generation_id); }
  });
  li.insertBefore(mark, li.querySelector(".head") || body);  // first, so on a phone it floats beside the text
  if (RoomMarkdown.allSubtext(m.content)) li.classList.add("boundary");
  applyKind(li, m);
  return li;
}

/* A message's buttons (action rows of type-2 components), as Discord shows them under the text. A link
 * button opens its URL; any other is pressed as the person named in the message box (`POST /_room/buttons`). */
function componentsOf(m, rows) {
  const box = document.createElement("div");
  box.className = "components";
  for (const row of rows) {
    const line = document.createElement("div");
    line.className = "action-row";
    for (const b of row.components) {
      let el;
      if (b.style === 5) {
        el = Object.assign(document.createElement("a"), {href: b.url, target: "_blank", rel: "noopener"});
        el.className = "component style-5";
      } else {
        el = Object.assign(document.createElement("button"), {type: "button", disabled: Boolean(b.disabled)});
        el.className = `component style-${b.style}`;
        el.dataset.customId = b.custom_id;
        el.addEventListener("click", () => pressButton(m, b, el));
      }
      el.textContent = b.label || "";
      line.append(el);
    }
    box.append(line);
  }
  return box;
}

async function pressButton(m, b, el) {
  const member = $("#author").value.trim();
  const error = $("#post-error");
  if (!member) {
    error.textContent = "Type your name in the message box to press a button as yourself.";
    error.hidden = false;
    $("#author").focus();
    return;
  }
  error.hidden = true;
  el.disabled = true;
  const entry = ephemeralEntry(`${b.label} · ${m.author}`, `${member} pressed it · only they see this`);
  const answer = entry.querySelector(".answer");
  if (!narrow()) openPanel();
  else if ($("#mod").hidden) $("#mod-toggle").classList.add("news");
  try {
    const out = await api("POST", "/_room/buttons", {
      channel: room.channelId, member, message_id: m.id, custom_id: b.custom_id, timeout: 15,
    });
    renderAnswer(answer, out.responses, out.timed_out);
  } catch (err) {
    answer.innerHTML = `<p class="error"></p>`;
    answer.querySelector("p").textContent = `Not pressed: ${err.message}`;
  } finally {
    entry.classList.remove("running");
    el.disabled = Boolean(b.disabled);  // a button its bot took away is gone with its message's update
  }
}

/* A message's kind: the annotator's answer; a person's message is speech; a bot's message the
 * annotator does not know stays "unrecorded" rather than being guessed. */
function applyKind(li, m) {
  const k = room.kinds.get(m.id);
  let kind, title;
  if (k && k.kind) {
    kind = k.kind;
    title = kind + (k.generation_id ? ` · generation ${k.generation_id}` : "") + (k.seq != null ? ` · post ${k.seq}` : "");
  } else if (!m.bot) {
    kind = "speech";
    title = "speech · posted by a person";
  } else if (!room.state.annotator) {
    kind = "unrecorded";
    title = "kind unknown: this room has no ledger to ask";
  } else if ((room.tries.get(m.id) || 0) > KIND_RETRIES.length) {
    kind = "unrecorded";
    title = "kind not recorded: no ledger entry for this message";
  } else {
    kind = "pending";
    title = "kind: looking up…";
  }
  for (const c of [...li.classList]) if (c.startsWith("kind-")) li.classList.remove(c);
  li.classList.add(`kind-${kind}`);
  if (kind === "receipt" || kind === "notice") li.classList.add("boundary");
  li.dataset.kind = kind;
  li.title = title;
  const mark = li.querySelector(".kind-mark");
  mark.textContent = kind;
  mark.title = k && k.generation_id ? `${title} — click for provenance` : title;
  mark.disabled = !(k && k.generation_id);
}

function nameOf(id) { return room.names.get(id); }
function channelName(id) { const c = room.state && room.state.channels.find((x) => x.id === id); return c && c.name; }

function avatar(name, bot) {
  const el = document.createElement("span");
  el.className = "avatar" + (bot ? " bot" : "");
  el.textContent = (name || "?")[0].toUpperCase();
  let h = 0;
  for (const ch of name || "") h = (h * 31 + ch.charCodeAt(0)) % 360;
  el.style.background = `hsl(${h} ${bot ? 55 : 40}% ${bot ? 45 : 38}%)`;
  return el;
}

function botTag() { return Object.assign(document.createElement("span"), {className: "bot-tag", textContent: "BOT"}); }

function timeEl(iso, long) {
  const t = new Date(iso);
  const el = document.createElement("time");
  el.dateTime = iso;
  el.title = t.toLocaleString();
  const hm = t.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"});
  const today = t.toDateString() === new Date().toDateString();
  el.textContent = long ? (today ? `Today at ${hm}` : `${t.toLocaleDateString()} ${hm}`) : hm;
  return el;
}

/* ----- annotations: batched, retried while the ledger catches up -------------------------------- */

function wantKind(id) {
  if (!room.state.annotator) return;
  room.pending.add(id);
  if (!room.flushTimer) room.flushTimer = setTimeout(flushKinds, 60);
}

async function flushKinds() {
  room.flushTimer = null;
  const ids = [...room.pending].slice(0, 200);
  ids.forEach((id) => room.pending.delete(id));
  if (room.pending.size) room.flushTimer = setTimeout(flushKinds, 0);
  if (!ids.length) return;
  let found = {};
  try {
    found = await api("GET", `/_room/annotations?ids=${ids.join(",")}`);
  } catch (err) {
    console.warn("annotations:", err);
  }
  for (const id of ids) {
    if (found[id]) room.kinds.set(id, found[id]);
    const m = room.messages.find((x) => x.id === id);
    if (!m) continue;
    if (found[id] && found[id].kind === "live") {  // ask again until its settled kind is known
      const n = room.liveChecks.get(id) || 0;
      room.liveChecks.set(id, n + 1);
      setTimeout(() => wantKind(id), LIVE_RECHECK_MS[Math.min(n, LIVE_RECHECK_MS.length - 1)]);
    } else {
      room.liveChecks.delete(id);
    }
    if (!found[id] && m.bot) {
      const n = (room.tries.get(id) || 0) + 1;
      room.tries.set(id, n);
      if (n <= KIND_RETRIES.length) setTimeout(() => wantKind(id), KIND_RETRIES[n - 1]);
    }
    const li = document.querySelector(`#messages li[data-id="${id}"]`);
    if (li) applyKind(li, m);
  }
}

/* ----- live events ---------------------------------------------------------------------------- */

function connectEvents() {
  const es = new EventSource("/_room/events");
  let dropped = false;
  es.addEventListener("open", () => {
    setConn("live", "live");
    if (dropped) { dropped = false; loadState().then(() => openChannel(room.channelId)).catch(showConnError); }
  });
  es.addEventListener("error", () => { dropped = true; setConn("reconnecting…", "down"); });
  es.addEventListener("message_create", (ev) => onMessage(JSON.parse(ev.data).message, "create"));
  es.addEventListener("message_update", (ev) => onMessage(JSON.parse(ev.data).message, "update"));
  es.addEventListener("message_delete", (ev) => onMessage(JSON.parse(ev.data).message, "delete"));
  es.addEventListener("typing", (ev) => onTyping(JSON.parse(ev.data)));
  es.addEventListener("show", (ev) => renderShow(JSON.parse(ev.data)));
  es.addEventListener("show_command", (ev) => showCommand(JSON.parse(ev.data)));
  es.addEventListener("member_add", refreshStateSoon);
  es.addEventListener("member_update", refreshStateSoon);
}

function onMessage(m, what) {
  room.names.set(m.author_id, m.author);
  if (m.channel_id !== room.channelId) return;
  const list = $("#messages");
  const atBottom = room.stick;
  const i = room.messages.findIndex((x) => x.id === m.id);
  if (what === "create" && i < 0) {
    const prev = room.messages[room.messages.length - 1];
    room.messages.push(m);
    list.append(messageItem(m, prev));
    stopTyping(m.author);
    wantKind(m.id);
    if (!atBottom) { room.unseen += 1; renderJump(); }
  } else if (what === "update" && i >= 0) {
    room.messages[i] = m;
    const li = list.querySelector(`li[data-id="${m.id}"]`);
    if (li) li.replaceWith(messageItem(m, room.messages[i - 1]));
    // A live reply is recorded when it settles (its last edit): ask its kind afresh.
    const k = room.kinds.get(m.id);
    if (m.bot && (!k || k.kind === "live")) { room.tries.delete(m.id); wantKind(m.id); }
  } else if (what === "delete" && i >= 0) {
    room.messages.splice(i, 1);
    const li = list.querySelector(`li[data-id="${m.id}"]`);
    if (li) li.remove();
    const next = room.messages[i];
    const nextLi = next && list.querySelector(`li[data-id="${next.id}"]`);
    if (nextLi) nextLi.replaceWith(messageItem(next, room.messages[i - 1]));  // its grouping may change
  }
  if (atBottom) list.scrollTop = list.scrollHeight;
  onScroll();
}

function onTyping(ev) {
  if (ev.channel_id !== room.channelId) return;
  clearTimeout(room.typing.get(ev.user));
  room.typing.set(ev.user, setTimeout(() => stopTyping(ev.user), 10000));
  renderTyping();
}

function stopTyping(name) {
  if (!room.typing.has(name)) return;
  clearTimeout(room.typing.get(name));
  room.typing.delete(name);
  renderTyping();
}

function renderTyping() {
  const who = [...room.typing.keys()];
  $("#typing").textContent = who.length ? `${who.join(", ")} ${who.length > 1 ? "are" : "is"} typing…` : "";
}

function setConn(text, cls) { const el = $("#conn"); el.textContent = text; el.className = `conn ${cls}`; }
function showConnError(err) { setConn(`error: ${err.message}`, "down"); }

/* ----- posting as a person ------------------------------------------------------------------- */

async function postMessage(ev) {
  ev.preventDefault();
  const author = $("#author").value.trim();
  const content = $("#content").value;
  const files = [...$("#files").files];
  const error = $("#post-error");
  error.hidden = true;
  if (!author || (!content.trim() && !files.length)) return;
  localStorage.setItem("room.author", author);
  try {
    if (files.length) {  // a multipart form: the fields, and each file as it is
      const form = new FormData();
      form.append("author", author);
      form.append("content", content);
      files.forEach((f, i) => form.append(`files[${i}]`, f, f.name));
      const resp = await fetch(`/_room/channels/${room.channelId}/messages`, {method: "POST", body: form});
      const data = await resp.json().catch(() => ({}));
      if (!resp.ok) throw new Error(data.message || `${resp.status} ${resp.statusText}`);
    } else {
      await api("POST", `/_room/channels/${room.channelId}/messages`, {author, content});
    }
    $("#content").value = "";
    $("#files").value = "";
  } catch (err) {
    error.textContent = `Not posted: ${err.message}`;
    error.hidden = false;
  }
}

/* ----- moderator panel: slash commands, ephemeral answers --------------------------------------- */

function openPanel() {
  if (!$("#mod").hidden) return;
  keepReading(() => { $("#mod").hidden = false; });
  $("#mod-toggle").setAttribute("aria-pressed", "true");
  $("#mod-toggle").classList.remove("news");
}

function closePanel() {
  if ($("#mod").hidden) return;
  keepReading(() => { $("#mod").hidden = true; });
  $("#mod-toggle").setAttribute("aria-pressed", "false");
}

function togglePanel() {
  if ($("#mod").hidden) openPanel();
  else closePanel();
}

const narrow = () => window.matchMedia("(max-width: 700px)").matches;

function openSide() {
  document.body.classList.add("side-open");
  $("#side-toggle").setAttribute("aria-expanded", "true");
  const active = $("#channels a.active") || $("#channels a");
  if (active) active.focus();
}

function closeSide() {
  if (!document.body.classList.contains("side-open")) return;
  document.body.classList.remove("side-open");
  $("#side-toggle").setAttribute("aria-expanded", "false");
}

const sub = (name, options = []) => [{name, type: 1, options}];

function runStumpsList() {
  const who = $("#mod-bot").value;
  return runCommand(`/stumps list`, "stumps", sub("list", who ? [{name: "resident", type: 3, value: who}] : []));
}
function runStumpsShow(id) { return runCommand(`/stumps show ${id}`, "stumps", sub("show", [{name: "id", type: 3, value: id}])); }
function runGenerationShow(ref) {
  return runCommand(`/generation show ${ref}`, "generation", sub("show", [{name: "ref", type: 3, value: ref}]));
}

function ephemeralEntry(label, note) {
  const entry = document.createElement("section");
  entry.className = "ephemeral running";
  entry.innerHTML = `<header><span class="cmd"></span><span class="only"></span></header><div class="answer">running…</div>`;
  entry.querySelector(".cmd").textContent = label;
  entry.querySelector(".only").textContent = note;
  $("#mod-out").prepend(entry);
  return entry;
}

function renderAnswer(answer, responses, timedOut) {
  const shown = new Map();  // message id -> content; an edit replaces what it edits
  responses.forEach((r, i) => {
    if (r.content == null && !(r.embeds || []).length) return;
    shown.set(r.message_id || `r${i}`, r);
  });
  const parts = [...shown.values()].filter((r) => r.content || (r.embeds || []).length);
  answer.innerHTML = parts.length ? parts.map((r) =>
    `<div class="response">${RoomMarkdown.render(r.content || "", {names: nameOf, channels: channelName, refs: true})}${
      (r.embeds || []).map((e) => `<div class="embed">${RoomMarkdown.render([e.title, e.description].filter(Boolean).join("\n"),
        {refs: true})}</div>`).join("")}</div>`).join("")
    : `<p class="muted">${timedOut ? "No answer: the resident did not respond in time." : "No answer."}</p>`;
}

/* A command the script's moderator ran (the demo): their ephemeral answer, shown here as they saw it. */
function showCommand(ev) {
  const key = `${ev.run}:${ev.index}`;
  if (ev.run != null && room.shownCommands.has(key)) return;  // from the event and from the status alike
  room.shownCommands.add(key);
  const entry = ephemeralEntry(`${ev.label} · ${ev.bot}`, `${ev.member} saw this (the demo's moderator)`);
  entry.classList.add("shown");
  renderAnswer(entry.querySelector(".answer"), ev.responses || [], false);
  entry.classList.remove("running");
  if (!narrow()) openPanel();  // on a phone the sheet would cover the chat: the toggle shows a mark instead
  else if ($("#mod").hidden) $("#mod-toggle").classList.add("news");
}

/* ----- a script playing in the room (the demo) ------------------------------------------------------ */

function renderShow(show) {
  const box = $("#show");
  box.hidden = !show;
  if (!show) return;
  room.show = show;
  // What the script's moderator saw so far, for a page opened after (or during) the script.
  for (const c of show.commands || []) showCommand(c);
  const playing = show.state === "playing";
  const status = {waiting: "demo: starts when you watch", playing: `demo playing · ${show.step}/${show.steps}`,
                  done: "demo played · the room is yours", failed: `demo stopped: ${show.problem || "error"}`}[show.state];
  $("#show-status").textContent = status || show.state;
  const button = $("#play-again");
  button.disabled = playing || show.state === "waiting";
  button.title = playing ? "The demo is playing" : `Play the demo again (${show.replay || "clears the channel"})`;
  document.body.dataset.show = show.state;
}

async function playAgain() {
  const button = $("#play-again");
  button.disabled = true;
  try {
    renderShow(await api("POST", "/_room/show/play"));
  } catch (err) {
    $("#show-status").textContent = `not played again: ${err.message}`;
    button.disabled = false;
  }
}

async function runCommand(label, name, options) {
  const picked = $("#mod-bot").value;
  const owner = room.state.bots.find((b) => (b.commands || []).includes(name));  // the bot that registered the command
  const bot = owner ? owner.name : picked;
  const entry = ephemeralEntry(`${label} · ${picked || "no resident"}`, "only you can see this");
  const answer = entry.querySelector(".answer");
  try {
    if (!bot) throw new Error("no resident bot is in the room");
    const out = await api("POST", "/_room/commands", {
      channel: room.channelId, member: $("#mod-name").value.trim() || "moderator",
      moderator: hasModeratorRole() ? true : undefined, bot, name, options, timeout: 15,
    });
    renderAnswer(answer, out.responses, out.timed_out);
  } catch (err) {
    answer.innerHTML = `<p class="error"></p>`;
    answer.querySelector("p").textContent = `Failed: ${err.message}`;
  } finally {
    entry.classList.remove("running");
  }
}

function onPanelClick(ev) {
  const a = ev.target.closest("a.ref");
  if (!a) return;
  ev.preventDefault();
  if (a.classList.contains("ref-stump")) runStumpsShow(a.dataset.ref);
  else runGenerationShow(a.dataset.ref);
}

/* ----- start ------------------------------------------------------------------------------------ */

async function start() {
  $("#author").value = localStorage.getItem("room.author") || "";
  $("#post").addEventListener("submit", postMessage);
  $("#content").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("#post").requestSubmit(); }
  });
  $("#mod-toggle").addEventListener("click", togglePanel);
  $("#mod-close").addEventListener("click", () => { closePanel(); $("#mod-toggle").focus(); });
  $("#side-toggle").addEventListener("click", () => (document.body.classList.contains("side-open") ? closeSide() : openSide()));
  $("#play-again").addEventListener("click", playAgain);
  $("#jump").addEventListener("click", jumpToLatest);
  $("#messages").addEventListener("scroll", onScroll, {passive: true});
  new ResizeObserver(() => { if (room.stick) $("#messages").scrollTop = $("#messages").scrollHeight; }).observe($("#messages"));
  document.addEventListener("keydown", (ev) => {
    if (ev.key !== "Escape") return;
    if (document.body.classList.contains("side-open")) { closeSide(); $("#side-toggle").focus(); }
    else if (!$("#mod").hidden && $("#mod").contains(document.activeElement)) { closePanel(); $("#mod-toggle").focus(); }
  });
  $("#stumps-list").addEventListener("click", runStumpsList);
  $("#stumps-show").addEventListener("submit", (ev) => { ev.preventDefault(); runStumpsShow($("#stump-id").value.trim()); });
  $("#generation-show").addEventListener("submit", (ev) => {
    ev.preventDefault();
    runGenerationShow($("#generation-ref").value.trim());
  });
  $("#mod-out").addEventListener("click", onPanelClick);
  $("#guild-select").addEventListener("change", (ev) => {
    const first = room.state.channels.find((c) => c.guild === ev.target.value);
    if (first) openChannel(first.id);
  });
  try {
    await loadState();
    const wanted = decodeURIComponent(location.hash.slice(1));
    const ch = room.state.channels.find((c) => c.ref === wanted || c.name === wanted) || room.state.channels[0];
    connectEvents();
    await openChannel(ch.id);
    document.body.dataset.ready = "1";
  } catch (err) {
    showConnError(err);
  }
}

start();
