// deltaq chat page. Talks to this server's /props and /v1/chat/completions (streamed over SSE) and
// keeps conversations and settings in the browser's localStorage. Model output is always inserted as
// text (textContent / text nodes), never as markup.
'use strict';

const $ = (id) => document.getElementById(id);

const KEY_CONVS = 'deltaq.conversations';
const KEY_SETTINGS = 'deltaq.settings';
const KEY_CURRENT = 'deltaq.current';

// Sampling fields of the settings dialog: [element id, request field, integer?].
const NUMBER_FIELDS = [
  ['temperature', 'temperature', false],
  ['top_p', 'top_p', false],
  ['top_k', 'top_k', true],
  ['min_p', 'min_p', false],
  ['presence_penalty', 'presence_penalty', false],
  ['max_tokens', 'max_tokens', true],
];

// Images larger than this on a side are scaled down before sending (phone photos are huge, and the
// server's vision tower caps the tokens an image becomes anyway).
const IMAGE_MAX_SIDE = 1536;

const DEFAULT_SETTINGS = {
  system: '',
  temperature: '',
  top_p: '',
  top_k: '',
  min_p: '',
  presence_penalty: '',
  max_tokens: '',
  thinking: null, // null: the server's default
  apiKey: '',
};

function loadJson(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v ? JSON.parse(v) : fallback;
  } catch {
    return fallback;
  }
}

function saveJson(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false; // quota exceeded or storage disabled
  }
}

const state = {
  props: null,
  settings: validSettings(loadJson(KEY_SETTINGS, {})),
  convs: validConversations(loadJson(KEY_CONVS, [])),
  currentId: loadJson(KEY_CURRENT, null),
  pending: [], // data URLs of images attached to the next message
  running: null, // {controller, conv, msg, view} while a reply streams
  views: new Map(), // message → its elements, for the shown conversation
};

// Stored data may come from an older page or be edited by hand: keep what has the expected shape.
function validSettings(v) {
  const out = Object.assign({}, DEFAULT_SETTINGS);
  if (!v || typeof v !== 'object') return out;
  for (const k of Object.keys(DEFAULT_SETTINGS)) {
    if (k === 'thinking') {
      if (typeof v.thinking === 'boolean') out.thinking = v.thinking;
    } else if (typeof v[k] === 'string') {
      out[k] = v[k];
    }
  }
  return out;
}

function validConversations(v) {
  if (!Array.isArray(v)) return [];
  return v.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages)).map((c) => ({
    id: c.id,
    title: typeof c.title === 'string' ? c.title : 'Chat',
    updated: Number(c.updated) || 0,
    messages: c.messages.filter((m) => m && (m.role === 'user' || m.role === 'assistant')).map((m) => ({
      role: m.role,
      text: typeof m.text === 'string' ? m.text : '',
      reasoning: typeof m.reasoning === 'string' ? m.reasoning : '',
      images: Array.isArray(m.images) ? m.images.filter((u) => typeof u === 'string' && u.startsWith('data:image/')) : [],
      imagesDropped: m.imagesDropped === true,
      stopped: m.stopped === true,
      error: typeof m.error === 'string' ? m.error : '',
      finish: typeof m.finish === 'string' ? m.finish : '',
      stats: m.stats && typeof m.stats === 'object' ? m.stats : null,
      thinkMs: Number(m.thinkMs) || 0,
    })),
  }));
}

function emptyMessage(role, text) {
  return {
    role,
    text,
    reasoning: '',
    images: [],
    imagesDropped: false,
    stopped: false,
    error: '',
    finish: '',
    stats: null,
    thinkMs: 0,
  };
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function currentConv() {
  return state.convs.find((c) => c.id === state.currentId) || null;
}

// Saves every conversation; when the browser's quota is full, the images of the oldest conversations
// go first (their messages say so), then a notice.
function saveConversations() {
  if (saveJson(KEY_CONVS, state.convs)) return;
  const byAge = state.convs.slice().sort((a, b) => a.updated - b.updated);
  for (const c of byAge) {
    let dropped = false;
    for (const m of c.messages) {
      if (m.images.length) {
        m.images = [];
        m.imagesDropped = true;
        dropped = true;
      }
    }
    if (dropped && saveJson(KEY_CONVS, state.convs)) return;
  }
  showToast('The browser storage is full: this conversation is not saved. Delete old conversations.');
}

function saveSettings() {
  saveJson(KEY_SETTINGS, state.settings);
}

function thinkingOn() {
  if (typeof state.settings.thinking === 'boolean') return state.settings.thinking;
  return state.props ? state.props.default_thinking : true;
}

// ----------------------------------------------------------------------------------------------
// Rendering

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function svgIcon(path) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('aria-hidden', 'true');
  const p = document.createElementNS(ns, 'path');
  p.setAttribute('d', path);
  svg.appendChild(p);
  return svg;
}

// Text with ``` fenced code blocks shown as <pre>; everything else stays plain text.
function renderText(target, text) {
  const parts = text.split('```');
  const nodes = [];
  parts.forEach((part, i) => {
    if (i % 2 === 0) {
      // The newline after a closing fence belongs to the fence.
      const t = i > 0 ? part.replace(/^\n/, '') : part;
      if (t) nodes.push(document.createTextNode(t));
      return;
    }
    // The first line of a fence is its language tag.
    const nl = part.indexOf('\n');
    const code = nl >= 0 && !/\s/.test(part.slice(0, nl)) ? part.slice(nl + 1) : part;
    const pre = el('pre');
    pre.appendChild(el('code', '', code.replace(/\n$/, '')));
    nodes.push(pre);
  });
  target.replaceChildren(...nodes);
}

function renderConversationList() {
  const list = $('conversations');
  const items = state.convs.slice().sort((a, b) => b.updated - a.updated).map((c) => {
    const li = el('li');
    li.dataset.id = c.id;
    if (c.id === state.currentId) li.classList.add('current');
    const open = el('button', 'conv-open', c.title || 'Chat');
    open.type = 'button';
    open.title = c.title || 'Chat';
    open.addEventListener('click', () => {
      switchTo(c.id);
      closeSidebar();
    });
    const del = el('button', 'conv-delete');
    del.type = 'button';
    del.title = 'Delete';
    del.setAttribute('aria-label', 'Delete conversation');
    del.appendChild(svgIcon('M5 7h14M10 7V4h4v3M7 7l1 13h8l1-13'));
    del.addEventListener('click', () => deleteConv(c.id));
    li.append(open, del);
    return li;
  });
  list.replaceChildren(...items);
}

function renderMessages() {
  const box = $('messages');
  const conv = currentConv();
  $('title').textContent = conv ? conv.title : 'New chat';
  const views = [];
  state.views = new Map();
  if (conv) {
    const last = conv.messages.length - 1;
    conv.messages.forEach((m, i) => {
      const v = messageView(m);
      state.views.set(m, v);
      views.push(v.root);
      if (m.role === 'assistant') updateAssistant(v, m, i === last);
    });
  }
  $('empty').hidden = views.length > 0;
  box.replaceChildren($('empty'), ...views);
  box.scrollTop = box.scrollHeight;
}

function messageView(m) {
  const root = el('div', 'msg ' + m.role);
  const v = { root };
  if (m.role === 'user') {
    if (m.images.length || m.imagesDropped) {
      const imgs = el('div', 'images');
      for (const url of m.images) {
        const img = el('img');
        img.src = url;
        img.alt = 'attached image';
        imgs.appendChild(img);
      }
      if (m.imagesDropped) imgs.appendChild(el('span', 'meta', '(image not kept: browser storage was full)'));
      root.appendChild(imgs);
    }
    const bubble = el('div', 'bubble');
    const content = el('div', 'content');
    renderText(content, m.text);
    bubble.appendChild(content);
    root.appendChild(bubble);
    return v;
  }
  v.details = el('details', 'thinking');
  v.summary = el('summary', '', 'Thinking');
  v.thought = el('div', 'thought');
  v.details.append(v.summary, v.thought);
  v.details.hidden = true;
  v.content = el('div', 'content');
  v.error = el('div', 'error');
  v.error.hidden = true;
  v.meta = el('div', 'meta');
  root.append(v.details, v.content, v.error, v.meta);
  return v;
}

// Brings an assistant message's view up to date with the message (called once per animation frame
// while it streams).
function updateAssistant(v, m, isLast) {
  const live = state.running && state.running.msg === m;
  v.root.classList.toggle('waiting', live && !m.text && !m.reasoning);
  v.root.classList.toggle('thinking-now', live && !!m.reasoning && !m.text);
  v.root.classList.toggle('stopped', m.stopped);
  if (m.reasoning) {
    v.details.hidden = false;
    if (v.thought.textContent.length !== m.reasoning.length) v.thought.textContent = m.reasoning;
    v.summary.textContent = live && !m.text ? 'Thinking' : m.thinkMs ? `Thought for ${(m.thinkMs / 1000).toFixed(1)} s` : 'Thoughts';
    // Open while the model thinks, closed once the answer starts (the user may reopen it).
    if (live && !m.text && !v.autoOpened) {
      v.details.open = true;
      v.autoOpened = true;
    }
    if (live && m.text && !v.autoClosed) {
      v.details.open = false;
      v.autoClosed = true;
    }
  }
  if (v.renderedLength !== m.text.length) {
    renderText(v.content, m.text.replace(/^\s+/, ''));
    v.renderedLength = m.text.length;
  }
  v.error.hidden = !m.error;
  v.error.textContent = m.error;
  const meta = [];
  if (m.stopped) meta.push(el('span', 'tag', 'stopped'));
  if (m.finish === 'length') meta.push(el('span', 'tag', 'length limit reached'));
  if (!live && !m.text && !m.reasoning && !m.error && !m.stopped) meta.push(el('span', 'tag', 'empty answer'));
  if (m.stats && typeof m.stats.tokens === 'number') {
    const rate = m.stats.ms > 0 && m.stats.tokens > 0 ? ` · ${(m.stats.tokens / (m.stats.ms / 1000)).toFixed(1)} tokens/s` : '';
    meta.push(el('span', '', `${m.stats.tokens} tokens${rate}`));
  }
  if (isLast && !live) {
    const again = el('button', '', m.error ? 'Retry' : 'Regenerate');
    again.type = 'button';
    again.className = 'regenerate';
    again.addEventListener('click', regenerate);
    meta.push(again);
  }
  v.meta.replaceChildren(...meta);
}

function nearBottom(box) {
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

let frameQueued = false;
function scheduleUpdate() {
  if (frameQueued) return;
  frameQueued = true;
  requestAnimationFrame(() => {
    frameQueued = false;
    const r = state.running;
    if (!r) return;
    const box = $('messages');
    const stick = nearBottom(box);
    updateAssistant(r.view, r.msg, true);
    if (stick) box.scrollTop = box.scrollHeight;
  });
}

let toastTimer = 0;
function showToast(text) {
  let t = document.querySelector('.toast');
  if (!t) {
    t = el('div', 'error toast');
    t.setAttribute('role', 'alert');
    $('composer').prepend(t);
  }
  t.textContent = text;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => t.remove(), 8000);
}

// ----------------------------------------------------------------------------------------------
// Conversations

function switchTo(id) {
  if (state.running) stopGeneration();
  state.currentId = id;
  saveJson(KEY_CURRENT, id);
  renderConversationList();
  renderMessages();
}

function newChat() {
  if (state.running) stopGeneration();
  state.currentId = null;
  saveJson(KEY_CURRENT, null);
  renderConversationList();
  renderMessages();
  closeSidebar();
  $('input').focus();
}

function deleteConv(id) {
  const c = state.convs.find((x) => x.id === id);
  if (!c || !confirm(`Delete “${c.title}”?`)) return;
  if (state.running && state.running.conv === c) stopGeneration();
  state.convs = state.convs.filter((x) => x.id !== id);
  saveConversations();
  if (state.currentId === id) state.currentId = null;
  saveJson(KEY_CURRENT, state.currentId);
  renderConversationList();
  renderMessages();
}

// ----------------------------------------------------------------------------------------------
// Talking to the server

function authHeaders() {
  const h = { 'Content-Type': 'application/json' };
  if (state.settings.apiKey) h.Authorization = 'Bearer ' + state.settings.apiKey;
  return h;
}

function requestBody(conv, upTo) {
  const messages = [];
  const system = state.settings.system.trim();
  if (system) messages.push({ role: 'system', content: system });
  const vision = state.props && state.props.modalities.vision;
  for (const m of conv.messages.slice(0, upTo)) {
    if (m.role === 'user') {
      if (m.images.length && vision) {
        const parts = m.images.map((url) => ({ type: 'image_url', image_url: { url } }));
        if (m.text) parts.push({ type: 'text', text: m.text });
        messages.push({ role: 'user', content: parts });
      } else {
        messages.push({ role: 'user', content: m.text || '(image)' });
      }
    } else if (m.text) {
      // Failed or empty replies are left out; the template drops old thinking anyway.
      messages.push({ role: 'assistant', content: m.text });
    }
  }
  const body = {
    messages,
    stream: true,
    chat_template_kwargs: { enable_thinking: thinkingOn() },
  };
  for (const [id, field, integer] of NUMBER_FIELDS) {
    const raw = String(state.settings[id]).trim();
    if (raw === '') continue;
    const n = Number(raw);
    if (Number.isFinite(n)) body[field] = integer ? Math.round(n) : n;
  }
  return body;
}

class ServerError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorOf(res) {
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch {
    // not JSON: keep the status line
  }
  if (res.status === 401) message = 'This server needs an API key: enter it in Settings.';
  if (res.status === 503) message = `The server is busy: ${message}`;
  return new ServerError(res.status, message);
}

// Reads an SSE body, calling onEvent with each `data:` payload parsed as JSON.
async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function generate(conv) {
  const msg = emptyMessage('assistant', '');
  const upTo = conv.messages.length;
  conv.messages.push(msg);
  conv.updated = Date.now();
  renderMessages();
  const view = state.views.get(msg);
  const controller = new AbortController();
  state.running = { controller, conv, msg, view };
  setBusy(true);
  const started = performance.now();
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: authHeaders(),
      body: JSON.stringify(requestBody(conv, upTo)),
      signal: controller.signal,
    });
    if (!res.ok) throw await errorOf(res);
    await readEvents(res, (chunk) => {
      if (chunk.error) throw new ServerError(0, chunk.error.message || 'the generation failed');
      const choice = chunk.choices && chunk.choices[0];
      const delta = choice && choice.delta;
      if (delta && typeof delta.reasoning_content === 'string') msg.reasoning += delta.reasoning_content;
      if (delta && typeof delta.content === 'string' && delta.content) {
        if (!msg.text && msg.reasoning) msg.thinkMs = performance.now() - started;
        msg.text += delta.content;
      }
      if (choice && choice.finish_reason) msg.finish = choice.finish_reason;
      if (chunk.timings) msg.stats = { tokens: chunk.timings.predicted_n, ms: chunk.timings.predicted_ms };
      scheduleUpdate();
    });
  } catch (e) {
    if (e.name === 'AbortError') {
      msg.stopped = true;
    } else if (e instanceof ServerError) {
      msg.error = e.message;
      if (e.status === 401) openSettings(e.message);
    } else if (e instanceof TypeError) {
      msg.error = 'Cannot reach the server (' + e.message + ').';
    } else {
      msg.error = String(e.message || e);
    }
  } finally {
    if (msg.reasoning && !msg.text && !msg.thinkMs) msg.thinkMs = performance.now() - started;
    state.running = null;
    conv.updated = Date.now();
    saveConversations();
    setBusy(false);
    updateAssistant(view, msg, conv === currentConv() && conv.messages[conv.messages.length - 1] === msg);
    renderConversationList();
  }
}

function stopGeneration() {
  if (state.running) state.running.controller.abort();
}

function setBusy(busy) {
  document.body.classList.toggle('busy', busy);
  $('send').hidden = busy;
  $('stop').hidden = !busy;
  updateSendEnabled();
}

function updateSendEnabled() {
  const has = $('input').value.trim() !== '' || state.pending.length > 0;
  $('send').disabled = !has;
}

function send() {
  if (state.running) return;
  const input = $('input');
  const text = input.value.trim();
  if (!text && !state.pending.length) return;
  let conv = currentConv();
  if (!conv) {
    conv = { id: newId(), title: '', updated: Date.now(), messages: [] };
    state.convs.push(conv);
    state.currentId = conv.id;
    saveJson(KEY_CURRENT, conv.id);
  }
  if (!conv.title) conv.title = (text || 'Image').replace(/\s+/g, ' ').slice(0, 60);
  const msg = emptyMessage('user', text);
  msg.images = state.pending.slice();
  conv.messages.push(msg);
  state.pending = [];
  renderAttachments();
  input.value = '';
  autoGrow();
  renderConversationList();
  generate(conv);
}

function regenerate() {
  const conv = currentConv();
  if (!conv || state.running) return;
  const last = conv.messages[conv.messages.length - 1];
  if (last && last.role === 'assistant') conv.messages.pop();
  if (!conv.messages.length) return;
  generate(conv);
}

// ----------------------------------------------------------------------------------------------
// Images

async function toDataUrl(file) {
  const bitmap = await createImageBitmap(file);
  const scale = Math.min(1, IMAGE_MAX_SIDE / Math.max(bitmap.width, bitmap.height));
  const keep = scale === 1 && ['image/png', 'image/jpeg', 'image/webp'].includes(file.type) && file.size < 1.5e6;
  if (keep) {
    bitmap.close();
    return new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(r.result);
      r.onerror = () => reject(r.error);
      r.readAsDataURL(file);
    });
  }
  const canvas = document.createElement('canvas');
  canvas.width = Math.max(1, Math.round(bitmap.width * scale));
  canvas.height = Math.max(1, Math.round(bitmap.height * scale));
  const ctx = canvas.getContext('2d');
  ctx.fillStyle = '#fff'; // JPEG has no alpha
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  return canvas.toDataURL('image/jpeg', 0.9);
}

async function addFiles(files) {
  for (const f of files) {
    try {
      state.pending.push(await toDataUrl(f));
    } catch {
      showToast(`Cannot read ${f.name} as an image.`);
    }
  }
  renderAttachments();
}

function renderAttachments() {
  const box = $('attachments');
  const thumbs = state.pending.map((url, i) => {
    const t = el('div', 'thumb');
    const img = el('img');
    img.src = url;
    img.alt = 'image to send';
    const rm = el('button', '', '×');
    rm.type = 'button';
    rm.setAttribute('aria-label', 'Remove image');
    rm.addEventListener('click', () => {
      state.pending.splice(i, 1);
      renderAttachments();
    });
    t.append(img, rm);
    return t;
  });
  box.replaceChildren(...thumbs);
  updateSendEnabled();
}

// ----------------------------------------------------------------------------------------------
// Settings and layout

function placeholders() {
  const p = state.props;
  if (!p) return;
  const d = thinkingOn() ? p.default_sampling.thinking : p.default_sampling.no_thinking;
  for (const [id] of NUMBER_FIELDS) {
    if (id in d) $(id).placeholder = String(d[id]);
  }
  $('max_tokens').placeholder = `up to the context (${p.n_ctx})`;
}

function openSettings(note) {
  for (const [id] of NUMBER_FIELDS) $(id).value = state.settings[id];
  $('system').value = state.settings.system;
  $('api-key').value = state.settings.apiKey;
  $('settings-note').textContent = note || '';
  $('settings-note').hidden = !note;
  placeholders();
  const d = $('settings');
  if (!d.open) d.showModal();
  if (note) $('api-key').focus();
}

function readSettings() {
  for (const [id] of NUMBER_FIELDS) state.settings[id] = $(id).value.trim();
  state.settings.system = $('system').value;
  state.settings.apiKey = $('api-key').value.trim();
  saveSettings();
}

function closeSidebar() {
  $('app').classList.remove('side-open');
}

function autoGrow() {
  const t = $('input');
  t.style.height = 'auto';
  t.style.height = Math.min(t.scrollHeight, 200) + 'px';
  updateSendEnabled();
}

async function loadProps() {
  try {
    const res = await fetch('/props');
    if (!res.ok) throw new Error(`${res.status}`);
    const p = await res.json();
    state.props = p;
    $('model-name').textContent = p.model;
    $('empty-model').textContent = `${p.model} · context ${p.n_ctx} tokens`;
    $('attach').hidden = !p.modalities.vision;
    if (!p.chat) showToast('This model has no chat template: the chat cannot work with it.');
  } catch (e) {
    $('model-name').textContent = 'server unreachable';
    showToast('Cannot load the server properties: ' + e.message);
  }
  $('thinking').checked = thinkingOn();
  placeholders();
  document.body.dataset.ready = '1';
}

function wire() {
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    send();
  });
  const input = $('input');
  input.addEventListener('input', autoGrow);
  input.addEventListener('keydown', (e) => {
    // Enter sends; Shift+Enter (and Enter on touch keyboards) makes a new line.
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && !matchMedia('(pointer: coarse)').matches) {
      e.preventDefault();
      send();
    }
  });
  $('stop').addEventListener('click', stopGeneration);
  $('new-chat').addEventListener('click', newChat);
  $('menu').addEventListener('click', () => $('app').classList.toggle('side-open'));
  $('scrim').addEventListener('click', closeSidebar);
  $('thinking').addEventListener('change', (e) => {
    state.settings.thinking = e.target.checked;
    saveSettings();
    placeholders();
  });
  $('open-settings').addEventListener('click', () => openSettings(''));
  $('close-settings').addEventListener('click', () => $('settings').close());
  $('settings').addEventListener('close', readSettings);
  $('reset-settings').addEventListener('click', () => {
    for (const [id] of NUMBER_FIELDS) $(id).value = '';
    $('system').value = '';
  });
  $('file').addEventListener('change', (e) => {
    addFiles(Array.from(e.target.files || []));
    e.target.value = '';
  });
  $('messages').addEventListener('dragover', (e) => {
    if (state.props && state.props.modalities.vision) e.preventDefault();
  });
  $('messages').addEventListener('drop', (e) => {
    if (!state.props || !state.props.modalities.vision) return;
    e.preventDefault();
    addFiles(Array.from(e.dataTransfer.files).filter((f) => f.type.startsWith('image/')));
  });
  // Another tab changed the stored conversations: show them (unless this tab is streaming).
  window.addEventListener('storage', (e) => {
    if (e.key !== KEY_CONVS || state.running) return;
    state.convs = validConversations(loadJson(KEY_CONVS, []));
    renderConversationList();
    renderMessages();
  });
}

wire();
if (!currentConv()) state.currentId = null;
renderConversationList();
renderMessages();
updateSendEnabled();
loadProps();
