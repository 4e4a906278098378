// npstream console: reads /api/... of the broker that serves this page and draws
// the pages (streams, one stream, groups, charts). No framework, no build step,
// nothing from elsewhere. Every value from the broker goes in as text (textContent),
// never as HTML. Read-only: it only ever sends GET.
"use strict";

const REFRESH_MS = 5000;
const TOKEN_KEY = "npstream-token";
const COLORS = ["#2457c5", "#d92d20", "#079455", "#dc6803", "#7a5af8", "#0e9384",
                "#c11574", "#4e5ba6", "#854a0e", "#475467"];

const state = {route: "", timer: 0, sort: {}, messages: {}};

// ------------------------------------------------------------------ helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }
  return node;
}

function num(value) {
  return value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US");
}

function rate(value) {
  if (value === null || value === undefined) return "–";
  return value >= 100 ? Math.round(value).toLocaleString("en-US") : value.toFixed(1);
}

function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = value, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (i === 0 ? String(v) : v.toFixed(1)) + " " + units[i];
}

function time(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC") : "–";
}

function age(ms, now) {
  if (!ms) return "–";
  const s = Math.max(0, (now - ms) / 1000);
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return (s / 60).toFixed(0) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function seconds(value) {
  if (!value) return "0 s";
  if (value < 120) return value.toFixed(1) + " s";
  if (value < 7200) return (value / 60).toFixed(1) + " min";
  if (value < 172800) return (value / 3600).toFixed(1) + " h";
  return (value / 86400).toFixed(1) + " d";
}

class Unauthorized extends Error {}

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const reply = await fetch("/api/" + path, {headers, cache: "no-store"});
  if (reply.status === 401) throw new Unauthorized("token needed");
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.message || reply.statusText);
  return body;
}

// A table whose columns sort on a header click (the choice survives refreshes).
function table(id, columns, rows, rowAttrs) {
  const sort = state.sort[id] || {key: columns[0].key, asc: true};
  const column = columns.find((c) => c.key === sort.key) || columns[0];
  const value = column.sort || ((row) => row[column.key]);
  const sorted = rows.slice().sort((a, b) => {
    const x = value(a), y = value(b);
    const order = x === y ? 0 : (x === null || x === undefined) ? 1
      : (y === null || y === undefined) ? -1 : x < y ? -1 : 1;
    return sort.asc ? order : -order;
  });
  const head = el("tr", {}, ...columns.map((c) => el("th", {
    class: [c.num ? "num" : "", c.key === column.key ? "sorted" + (sort.asc ? " asc" : "") : ""]
      .join(" ").trim() || null,
    "data-key": c.key, text: c.title,
    onclick: () => {
      state.sort[id] = {key: c.key, asc: c.key === column.key ? !sort.asc : !c.num};
      render();
    },
  })));
  const body = sorted.map((row) => el("tr", rowAttrs ? rowAttrs(row) : {},
    ...columns.map((c) => {
      const shown = c.show ? c.show(row) : row[c.key];
      return el("td", {class: [c.num ? "num" : "", c.cls || ""].join(" ").trim() || null,
                       "data-field": c.key},
                shown instanceof Node ? shown : String(shown ?? "–"));
    })));
  return el("table", {id}, el("thead", {}, head), el("tbody", {}, ...body));
}

// ------------------------------------------------------------------ pages

async function streamsPage() {
  const [data, overview] = await Promise.all([api("streams"), api("overview")]);
  const now = overview.now_ms;
  const cluster = overview.members.length > 1;
  const here = (r) => !cluster || r.member === overview.member;
  const columns = [
    // Another member's stream: its details and messages are on that member's console.
    {key: "name", title: "Stream",
     show: (r) => (here(r) ? el("a", {href: "#/stream/" + encodeURIComponent(r.name), text: r.name})
       : el("span", {text: r.name, title: "held by " + r.member}))},
    {key: "start_offset", title: "Start", num: true, show: (r) => num(r.start_offset)},
    {key: "end_offset", title: "End offset", num: true, show: (r) => num(r.end_offset)},
    {key: "message_count", title: "Messages", num: true, show: (r) => num(r.message_count)},
    {key: "bytes_on_disk", title: "Size", num: true, show: (r) => bytes(r.bytes_on_disk)},
    {key: "rate_in", title: "In msg/s", num: true, show: (r) => rate(r.rate_in)},
    {key: "rate_out", title: "Out msg/s", num: true, show: (r) => rate(r.rate_out)},
    {key: "segments", title: "Segments", num: true, show: (r) => num(r.segments)},
    {key: "first_timestamp_ms", title: "Oldest", num: true,
     show: (r) => age(r.first_timestamp_ms, now)},
    {key: "typed", title: "Typed", show: (r) => (r.typed ? "yes" : "")},
    {key: "error", title: "", show: (r) => (r.error ? el("span", {class: "error", text: "needs repair"}) : "")},
  ];
  if (cluster) {
    columns.splice(1, 0, {key: "member", title: "Member",
      show: (r) => (here(r) ? el("strong", {text: r.member + " (this one)"}) : r.member)});
  }
  const parts = [el("h2", {text: `Streams (${data.total})`}),
    table("streams", columns, data.streams, (r) => ({"data-stream": r.name}))];
  if (data.truncated) parts.push(el("p", {class: "muted", text: "Only the first streams are listed."}));
  for (const down of data.unavailable_members || []) {
    parts.push(el("p", {class: "error", "data-unavailable": "yes",
      text: "Cluster member did not answer, its streams are missing: " + down}));
  }
  if (!data.streams.length) parts.push(el("p", {class: "muted", text: "No streams you may read."}));
  return parts;
}

function configList(stream) {
  const entries = [
    ["Start offset", num(stream.start_offset)], ["End offset", num(stream.end_offset)],
    ["Messages", num(stream.message_count)], ["Size on disk", bytes(stream.bytes_on_disk)],
    ["Segments", num(stream.segments)], ["First message", time(stream.first_timestamp_ms)],
    ["Last message", time(stream.last_timestamp_ms)], ["Created", time(stream.created_ms)],
    ["Max age", stream.config.max_age_ms ? seconds(stream.config.max_age_ms / 1000) : "forever"],
    ["Max bytes", stream.config.max_bytes ? bytes(stream.config.max_bytes) : "no limit"],
    ["Dedup window", stream.config.dedup_window_ms ? seconds(stream.config.dedup_window_ms / 1000) : "off"],
    ["Max message", bytes(stream.config.max_message_bytes)],
    ["In msg/s", rate(stream.rate_in)], ["Out msg/s", rate(stream.rate_out)],
  ];
  const list = el("dl", {class: "config", id: "config"});
  for (const [name, value] of entries) {
    list.append(el("dt", {text: name}), el("dd", {"data-field": name, text: value}));
  }
  return list;
}

function messageView(message) {
  let text;
  if ("json" in message.value) text = JSON.stringify(message.value.json, null, 2);
  else if ("text" in message.value) text = message.value.text;
  else text = "(binary, base64) " + message.value.base64;
  const key = message.key ? (message.key.text ?? "(base64) " + message.key.base64) : null;
  const headers = Object.entries(message.headers || {})
    .map(([k, v]) => k + "=" + (v ? (v.text ?? v.base64) : "")).join(", ");
  return el("div", {class: "message", "data-offset": String(message.offset)},
    el("div", {class: "meta"},
      el("strong", {text: "#" + message.offset}), el("span", {text: time(message.timestamp_ms)}),
      el("span", {text: "id " + message.id}), key !== null ? el("span", {text: "key " + key}) : null,
      headers ? el("span", {text: "headers " + headers}) : null,
      el("span", {class: "muted", text: bytes(message.value_bytes)})),
    el("pre", {text}));
}

async function streamPage(name) {
  const query = state.messages[name] || {limit: "20"};
  const params = new URLSearchParams(query).toString();
  const [stream, page] = await Promise.all([
    api("streams/" + encodeURIComponent(name)),
    api("streams/" + encodeURIComponent(name) + "/messages?" + params),
  ]);
  const seekTime = el("input", {id: "seek-time", type: "text", size: "26",
    placeholder: "2025-01-01T12:00:00Z", value: query.time || ""});
  const seekOffset = el("input", {id: "seek-offset", type: "number", min: "0",
    placeholder: "offset", value: query.offset || ""});
  const limit = el("select", {id: "seek-limit"},
    ...["10", "20", "50", "100", "200"].map((n) => el("option",
      n === query.limit ? {value: n, selected: "selected", text: n} : {value: n, text: n})));
  const go = (change) => { state.messages[name] = {limit: limit.value, ...change}; render(); };
  const seek = el("form", {class: "seek", id: "seek", onsubmit: (e) => {
    e.preventDefault();
    if (seekTime.value) go({time: seekTime.value.trim()});
    else if (seekOffset.value) go({offset: seekOffset.value});
    else go({});
  }}, el("span", {text: "Show"}), limit, el("span", {text: "messages from time"}), seekTime,
    el("span", {text: "or offset"}), seekOffset, el("button", {type: "submit", text: "Seek"}),
    el("button", {type: "button", text: "Latest", onclick: () => go({})}));
  const groupColumns = [
    {key: "group", title: "Group"}, {key: "kind", title: "Kind"},
    {key: "committed_offset", title: "Committed", num: true, show: (g) => num(g.committed_offset)},
    {key: "lag", title: "Lag", num: true, cls: "lag", show: (g) => num(g.lag)},
    {key: "in_flight", title: "In flight", num: true},
  ];
  const schema = stream.schemas.length
    ? el("p", {}, el("strong", {text: "Value schema v" + stream.schemas.at(-1).version + ": "}),
      el("code", {text: stream.schemas.at(-1).ddl}))
    : el("p", {class: "muted", text: "Untyped stream (binary values)."});
  const from = page.messages.length
    ? `offsets ${num(page.messages[0].offset)}–${num(page.messages.at(-1).offset)} of ` +
      `[${num(page.start_offset)}, ${num(page.end_offset)})`
    : `no messages from offset ${num(page.from_offset)}`;
  return [
    el("h2", {id: "stream-name", text: "Stream " + stream.name}),
    stream.error ? el("p", {class: "error", text: stream.error}) : null,
    configList(stream), schema,
    el("h2", {text: "Groups"}),
    stream.groups.length ? table("stream-groups", groupColumns, stream.groups,
      (g) => ({"data-group": g.group}))
      : el("p", {class: "muted", text: "No groups."}),
    el("h2", {text: "Messages"}), seek,
    el("p", {class: "muted", id: "messages-range", text: from}),
    el("div", {id: "messages"}, ...page.messages.map(messageView)),
  ];
}

async function groupsPage() {
  const data = await api("groups");
  const columns = [
    {key: "stream", title: "Stream",
     show: (g) => el("a", {href: "#/stream/" + encodeURIComponent(g.stream), text: g.stream})},
    {key: "group", title: "Group"}, {key: "kind", title: "Kind"},
    {key: "committed_offset", title: "Committed", num: true, show: (g) => num(g.committed_offset)},
    {key: "end_offset", title: "End offset", num: true, show: (g) => num(g.end_offset)},
    {key: "lag", title: "Lag", num: true, cls: "lag", show: (g) => num(g.lag)},
    {key: "lag_seconds", title: "Lag time", num: true, show: (g) => seconds(g.lag_seconds)},
    {key: "in_flight", title: "In flight", num: true, show: (g) => num(g.in_flight)},
    {key: "members_connected", title: "Members", num: true,
     show: (g) => `${g.members_connected} / ${g.members.length}`},
    {key: "redelivered", title: "Redelivered", num: true, show: (g) => num(g.redelivered)},
    {key: "dead_lettered", title: "Dead-lettered", num: true, show: (g) => num(g.dead_lettered)},
    {key: "dead_letter_stream", title: "DLQ stream",
     show: (g) => (g.max_deliver ? g.dead_letter_stream : "–")},
  ];
  const members = data.groups.filter((g) => g.members.length).map((g) => el("div", {},
    el("h3", {text: `${g.stream} / ${g.group}`}),
    table("members-" + g.stream + "-" + g.group, [
      {key: "member_id", title: "Member"},
      {key: "connected", title: "Connected", show: (m) => (m.connected ? "yes" : "no")},
      {key: "in_flight", title: "In flight", num: true},
      {key: "last_seen_ms", title: "Last seen", show: (m) => time(m.last_seen_ms)},
    ], g.members)));
  return [
    el("h2", {text: `Groups (${data.groups.length})`}),
    table("groups", columns, data.groups, (g) => ({
      "data-stream": g.stream, "data-group": g.group, class: g.lag > 0 ? "lagging" : null})),
    data.groups.length ? null : el("p", {class: "muted", text: "No groups you may read."}),
    members.length ? el("h2", {text: "Members"}) : null, ...members,
  ];
}

// A line chart of several series over time (SVG, drawn here: no chart library).
function chart(id, title, unit, times, series, format) {
  const W = 1000, H = 260, L = 60, R = 10, T = 12, B = 26;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("id", id);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  const names = Object.keys(series);
  let max = 0;
  for (const name of names) for (const v of series[name]) if (v !== null && v > max) max = v;
  max = max > 0 ? max * 1.1 : 1;
  const t0 = times[0] || 0, t1 = times.at(-1) || 1, span = Math.max(t1 - t0, 1);
  const x = (t) => L + ((t - t0) / span) * (W - L - R);
  const y = (v) => H - B - (v / max) * (H - T - B);
  for (let i = 0; i <= 4; i += 1) {
    const v = (max * i) / 4;
    add("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), class: "axis"});
    add("text", {x: L - 6, y: y(v) + 4, "text-anchor": "end"}, format(v));
  }
  add("text", {x: L, y: H - 8}, new Date(t0 * 1000).toISOString().slice(11, 19));
  add("text", {x: W - R, y: H - 8, "text-anchor": "end"},
      new Date(t1 * 1000).toISOString().slice(11, 19) + " UTC");
  const legend = el("div", {class: "legend"});
  names.forEach((name, i) => {
    const color = COLORS[i % COLORS.length];
    const values = series[name];
    const offset = times.length - values.length;  // rates: one value fewer than times
    let d = "";
    values.forEach((v, j) => {
      if (v === null) return;
      const t = offset ? (times[j] + times[j + 1]) / 2 : times[j];
      const prev = j > 0 && values[j - 1] !== null;
      d += `${prev ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)} `;
    });
    if (d) add("path", {d, fill: "none", stroke: color, "stroke-width": "2",
                        "data-series": name});
    const last = values.filter((v) => v !== null).at(-1);
    const item = el("span", {"data-series": name,
                             text: `${name}: ${last === undefined ? "–" : format(last)} ${unit}`});
    item.style.setProperty("--swatch", color);
    legend.append(item);
  });
  return el("div", {class: "chart"}, el("h2", {text: title}), svg,
    names.length ? legend : el("p", {class: "muted", text: "No data yet."}));
}

async function chartsPage() {
  const history = await api("history");
  const span = history.times.length > 1 ? history.times.at(-1) - history.times[0] : 0;
  return [el("div", {class: "charts"},
    chart("rate-chart", `Publish rate (messages/s, last ${seconds(span)})`, "msg/s",
          history.times, history.rates, rate),
    chart("lag-chart", "Group lag (messages)", "messages", history.times, history.lags,
          (v) => num(Math.round(v))))];
}

// ------------------------------------------------------------------ routing

function route() {
  const hash = location.hash.replace(/^#\/?/, "") || "streams";
  const [page, ...rest] = hash.split("/");
  return {page, arg: decodeURIComponent(rest.join("/"))};
}

async function render(refresh) {
  clearTimeout(state.timer);
  const {page, arg} = route();
  const typing = document.activeElement && document.activeElement.closest("form");
  if (refresh && typing) {  // do not redraw under someone typing a seek or a token
    state.timer = setTimeout(() => render(true), REFRESH_MS);
    return;
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page ||
                          (page === "stream" && link.dataset.page === "streams"));
  }
  const main = document.getElementById("main");
  try {
    let parts;
    if (page === "stream" && arg) parts = await streamPage(arg);
    else if (page === "groups") parts = await groupsPage();
    else if (page === "charts") parts = await chartsPage();
    else parts = await streamsPage();
    main.replaceChildren(...parts.filter((p) => p !== null));
    document.getElementById("login").hidden = true;
    main.hidden = false;
    document.getElementById("forget-token").hidden = !sessionStorage.getItem(TOKEN_KEY);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.page = page;
    document.body.dataset.ready = "yes";
    overview();
  } catch (error) {
    if (error instanceof Unauthorized) {
      showLogin(sessionStorage.getItem(TOKEN_KEY) ? "That token was not accepted." : "");
      return;
    }
    main.replaceChildren(el("p", {class: "error", id: "error", text: String(error.message || error)}));
  }
  state.timer = setTimeout(() => render(true), REFRESH_MS);
}

async function overview() {
  try {
    const o = await api("overview");
    document.getElementById("overview").textContent =
      `${o.streams} streams · ${o.groups} groups · lag ${num(o.lag_messages)} · up ` +
      age(o.started_ms, o.now_ms) + (o.auth ? " · auth on" : "") +
      (o.members.length > 1 ? ` · member ${o.member} of ${o.members.length}` : "");
  } catch (error) { /* the page itself reports errors */ }
}

function showLogin(message) {
  document.getElementById("main").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message;
  document.body.dataset.page = "login";
  document.body.dataset.ready = "yes";
  document.getElementById("token").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    document.getElementById("token").value = "";
    render();
  });
  document.getElementById("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    render();
  });
  window.addEventListener("hashchange", () => { document.body.dataset.ready = ""; render(); });
  render();
});
