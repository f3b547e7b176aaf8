// acceld dashboard: reads the public API with the caller's token and draws the fleet.
// No framework and no build step; every value reaches the page as text (textContent).
(() => {
  "use strict";

  const WANTED = [2, 6];  // the microversion of every list the page draws (health, events)
  const EXPLAIN = [2, 7];  // explain: asked at 2.7 where the API offers it
  const prefix = location.pathname.replace(/\/dashboard\/?$/, "");
  const API = prefix + "/v2";
  const query = new URLSearchParams(location.search);
  const $ = (id) => document.getElementById(id);
  const state = {
    token: sessionStorage.getItem("acceld.token") || "",
    version: null,     // [major, minor] used for every request
    max: null,         // the API's newest microversion
    selected: null,    // device uuid whose events are shown
    timer: null,
    busy: false,
    data: null,
  };

  // -- the API ----------------------------------------------------------------------------

  const vText = (v) => `${v[0]}.${v[1]}`;
  const atLeast = (v, major, minor) => v[0] > major || (v[0] === major && v[1] >= minor);

  async function call(path, version) {
    const headers = { "Accept": "application/json" };
    if (version) headers["OpenStack-API-Version"] = "accelerator " + vText(version);
    if (state.token) headers["X-Auth-Token"] = state.token;
    let resp;
    try {
      resp = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    } catch (err) {
      return { ok: false, status: 0, message: "the API did not answer" };
    }
    let body = null;
    try { body = await resp.json(); } catch (err) { body = null; }
    if (!resp.ok) return { ok: false, status: resp.status, message: fault(body) || resp.statusText };
    return { ok: true, status: resp.status, body: body };
  }

  // Cyborg's error body: {"error_message": "<JSON text with a faultstring>"}.
  function fault(body) {
    if (!body || typeof body.error_message !== "string") return "";
    try { return JSON.parse(body.error_message).faultstring || body.error_message; }
    catch (err) { return body.error_message; }
  }

  async function negotiate() {
    const doc = await call(API, null);
    if (!doc.ok || !doc.body || !doc.body.max_version) return [2, 0];
    const max = doc.body.max_version.split(".").map(Number);
    state.max = max;
    $("version").textContent = `API ${doc.body.min_version} – ${doc.body.max_version}`;
    return atLeast(max, WANTED[0], WANTED[1]) ? WANTED : max;
  }

  async function listArqs(version) {
    let path = API + "/accelerator_requests";
    const all = [];
    for (let page = 0; page < 50; page++) {
      const got = await call(path, version);
      if (!got.ok) return got;
      all.push(...(got.body.arqs || []));
      const next = (got.body.arqs_links || []).find((l) => l.rel === "next");
      if (!next) break;
      path = API + "/accelerator_requests" + new URL(next.href, location.href).search;
    }
    return { ok: true, body: { arqs: all } };
  }

  // -- shaping ----------------------------------------------------------------------------

  // Deployables name their device only by its database id, which devices do not show; both
  // lists are in id order, so within one host the n-th device is the n-th distinct id.
  function deployablesByDevice(devices, deployables) {
    const out = new Map();
    const hosts = new Set(devices.map((d) => d.hostname));
    for (const host of hosts) {
      const devs = devices.filter((d) => d.hostname === host);
      const deps = deployables.filter((p) => p.name.startsWith(host + "_"));
      const ids = [...new Set(deps.map((p) => p.device_id))].sort((a, b) => a - b);
      if (ids.length !== devs.length) continue;  // ambiguous: no per-device figures
      devs.forEach((d, i) => out.set(d.uuid, deps.filter((p) => p.device_id === ids[i])));
    }
    return out;
  }

  function shape(hosts, devices, deployables, arqs) {
    const deps = deployablesByDevice(devices, deployables);
    const deviceOfRp = new Map();
    for (const [uuid, list] of deps) list.forEach((p) => p.rp_uuid && deviceOfRp.set(p.rp_uuid, uuid));
    const byUuid = new Map(devices.map((d) => [d.uuid, d]));
    const used = new Map();
    for (const a of arqs) {
      const dev = deviceOfRp.get(a.device_rp_uuid);
      if (dev && a.attach_handle_uuid) used.set(dev, (used.get(dev) || 0) + 1);
    }
    for (const d of devices) {
      const list = deps.get(d.uuid);
      d._total = list ? list.reduce((n, p) => n + (p.num_accelerators || 0), 0) : null;
      d._used = list ? (used.get(d.uuid) || 0) : null;
    }
    for (const a of arqs) a._device = byUuid.get(deviceOfRp.get(a.device_rp_uuid)) || null;
    const hostNames = new Set([...hosts.map((h) => h.hostname), ...devices.map((d) => d.hostname)]);
    return { hosts, devices, arqs, hostNames: [...hostNames].sort(),
             types: [...new Set(devices.map((d) => d.type))].sort() };
  }

  // -- drawing ----------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  const TONES = {
    up: "ok", down: "bad", enabled: "ok", maintaining: "warn", healthy: "ok", degraded: "warn",
    unhealthy: "bad", unknown: "", Bound: "ok", BindFailed: "bad", BindStarted: "busy",
    Initial: "", Deleting: "warn", Unbound: "", UnbindFailed: "bad",
    satisfiable: "ok", "not satisfiable": "bad",
    disabled: "warn", quarantined: "bad", recovered: "ok", vanished: "warn", reappeared: "ok",
    health_changed: "busy", program_succeeded: "ok", program_failed: "bad",
  };
  const badge = (text, field) => el("span", { class: "badge " + (TONES[text] || ""),
    "data-field": field }, text);
  const short = (uuid) => (uuid ? uuid.slice(0, 8) : "–");

  function ago(iso) {
    if (!iso) return "never";
    const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (seconds < 90) return `${Math.round(seconds)} s ago`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
    if (seconds < 129600) return `${Math.round(seconds / 3600)} h ago`;
    return `${Math.round(seconds / 86400)} d ago`;
  }

  function fill(table, rows, columns, empty) {
    const body = $(table).tBodies[0];
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td",
      { class: "empty", colspan: String(columns) }, empty))]));
  }

  function note(id, text) {
    const n = $(id);
    n.hidden = !text;
    n.textContent = text || "";
  }

  function usage(d) {
    if (d._total === null) return el("span", { class: "muted", "data-field": "handles" }, "–");
    const pct = d._total ? Math.round(100 * d._used / d._total) : 0;
    const bar = el("span");
    bar.style.width = pct + "%";
    return el("div", { class: "usage", "data-field": "handles" },
      el("div", { class: "meter" }, bar), el("span", { class: "n" }, `${d._used} / ${d._total}`));
  }

  function draw() {
    const data = state.data;
    if (!data) return;
    const host = $("filter-host").value;
    const type = $("filter-type").value;
    syncOptions($("filter-host"), data.hostNames, "all hosts");
    syncOptions($("filter-type"), data.types, "all types");
    const hosts = data.hosts.filter((h) => !host || h.hostname === host);
    const devices = data.devices.filter((d) => (!host || d.hostname === host) && (!type || d.type === type));
    const arqs = data.arqs.filter((a) => (!host || a.hostname === host) &&
      (!type || (a._device && a._device.type === type)));

    fill("hosts", hosts.map((h) => el("tr", { "data-host": h.hostname },
      el("td", {}, h.hostname), el("td", {}, badge(h.state, "state")),
      el("td", { title: h.last_seen_at || "" }, ago(h.last_seen_at)), el("td", {}, h.devices))),
      4, data.hostsNote ? "–" : "No agent has reported yet.");
    $("hosts-count").textContent = hosts.length;

    fill("devices", devices.map((d) => {
      const health = d.health || "unknown";
      const row = el("tr", { class: "clickable" + (d.uuid === state.selected ? " selected" : ""),
        "data-uuid": d.uuid, "data-host": d.hostname, "data-type": d.type },
        el("td", {}, d.hostname), el("td", {}, d.type),
        el("td", {}, d.vendor, el("span", { class: "reason" }, d.model)),
        el("td", {}, badge(d.status || "enabled", "status"),
          d.status_reason ? el("span", { class: "reason" }, d.status_reason) : null),
        el("td", {}, badge(health, "health"), d.quarantined ? badge("quarantined", "quarantined") : null,
          d.health_reason ? el("span", { class: "reason" }, d.health_reason) : null),
        el("td", {}, usage(d)), el("td", { class: "mono", title: d.uuid }, short(d.uuid)));
      row.addEventListener("click", () => select(d.uuid));
      return row;
    }), 7, "No devices match.");
    $("devices-count").textContent = devices.length;

    fill("arqs", arqs.map((a) => el("tr", { "data-uuid": a.uuid },
      el("td", { class: "mono", title: a.uuid }, short(a.uuid)),
      el("td", {}, badge(a.state, "state")),
      el("td", { class: "mono", title: a.instance_uuid || "" }, a.instance_uuid || "–"),
      el("td", {}, a.hostname || "–"),
      el("td", {}, a._device ? `${a._device.type} ${short(a._device.uuid)}` : "–"),
      el("td", {}, a.device_profile_name || "–"))), 6, "No accelerator requests.");
    $("arqs-count").textContent = arqs.length;

    tiles(data);
  }

  function syncOptions(select, values, allLabel) {
    const current = select.value;
    const have = [...select.options].slice(1).map((o) => o.value);
    if (have.join("\n") === values.join("\n")) return;
    select.replaceChildren(el("option", { value: "" }, allLabel),
      ...values.map((v) => el("option", { value: v }, v)));
    select.value = values.includes(current) ? current : "";
  }

  function tiles(data) {
    const up = data.hosts.filter((h) => h.state === "up").length;
    $("t-hosts").textContent = data.hostsNote ? "–" : `${up} / ${data.hosts.length}`;
    $("t-hosts-sub").textContent = data.hostsNote ? "not permitted" :
      (data.hosts.length - up ? `${data.hosts.length - up} down` : "all reporting");
    $("t-hosts").parentElement.classList.toggle("alert", data.hosts.length - up > 0);
    const enabled = data.devices.filter((d) => d.status === "enabled").length;
    $("t-devices").textContent = data.devices.length;
    $("t-devices-sub").textContent = `${enabled} enabled, ${data.devices.length - enabled} maintaining`;
    const bad = data.devices.filter((d) => d.health === "unhealthy" || d.quarantined).length;
    const degraded = data.devices.filter((d) => d.health === "degraded").length;
    $("t-unhealthy").textContent = bad;
    const held = data.devices.filter((d) => d.quarantined).length;
    $("t-unhealthy-sub").textContent = [held ? `${held} quarantined` : "",
      degraded ? `${degraded} degraded` : ""].filter(Boolean).join(", ");
    $("t-unhealthy").parentElement.classList.toggle("alert", bad > 0);
    const known = data.devices.filter((d) => d._total !== null);
    const total = known.reduce((n, d) => n + d._total, 0);
    const used = known.reduce((n, d) => n + d._used, 0);
    $("t-handles").textContent = `${used} / ${total}`;
    $("t-handles-bar").style.width = (total ? Math.round(100 * used / total) : 0) + "%";
    const bound = data.arqs.filter((a) => a.state === "Bound").length;
    const failed = data.arqs.filter((a) => a.state === "BindFailed").length;
    $("t-arqs").textContent = bound;
    $("t-arqs-sub").textContent = `${data.arqs.length} in all` + (failed ? `, ${failed} failed` : "");
  }

  // -- events of one device --------------------------------------------------------------

  function select(uuid) {
    state.selected = uuid;
    draw();
    events();
  }

  async function events() {
    const uuid = state.selected;
    if (!uuid) return;
    $("events-device").textContent = short(uuid);
    if (!atLeast(state.version, 2, 6)) {
      note("events-note", "Device events need API microversion 2.6, which this API does not offer.");
      fill("events", [], 3, "–");
      return;
    }
    const got = await call(`${API}/devices/${encodeURIComponent(uuid)}/events?limit=20`, state.version);
    if (uuid !== state.selected) return;
    if (!got.ok) {
      note("events-note", `Events unavailable: ${got.message} (${got.status}).`);
      fill("events", [], 3, "–");
      return;
    }
    const list = (got.body && (got.body.events || got.body.device_events)) || [];
    note("events-note", list.length ? "" : "No events recorded for this device.");
    fill("events", list.map((e) => el("tr", {},
      el("td", { title: e.created_at || "" }, ago(e.created_at)),
      el("td", {}, badge(e.kind || e.type || "event", "kind")),
      el("td", {}, typeof e.detail === "object" && e.detail !== null ? JSON.stringify(e.detail)
        : (e.detail || e.reason || ""), e.actor ? el("span", { class: "reason" }, e.actor) : null))),
      3, "No events.");
  }

  // -- explain: why a profile can or cannot get an accelerator ----------------------------

  async function explain() {
    const profile = $("explain-profile").value;
    if (!profile) return;
    if (!state.max || !atLeast(state.max, EXPLAIN[0], EXPLAIN[1])) {
      note("explain-note", "Explain needs API microversion 2.7, which this API does not offer.");
      return;
    }
    $("explain-verdict").textContent = "";
    note("explain-note", "Asking…");
    const host = $("filter-host").value;  // the page's host filter narrows explain too
    const got = await call(`${API}/device_profiles/${encodeURIComponent(profile)}/explain` +
      (host ? `?hostname=${encodeURIComponent(host)}` : ""), EXPLAIN);
    if (profile !== $("explain-profile").value || host !== $("filter-host").value) return;
    if (!got.ok) {
      note("explain-note", `Explain unavailable: ${got.message} (${got.status}).`);
      fill("explain", [], 3, "–");
      return;
    }
    const doc = got.body;
    $("explain-verdict").textContent = doc.verdict;
    $("explain-verdict").className = "verdict " + (doc.satisfiable ? "ok" : "bad");
    const p = doc.placement;
    note("explain-note", p.status === "ok" ? "" : `Placement: ${p.message || p.status}`);
    fill("explain", doc.hosts.map((h) => el("tr", { "data-host": h.hostname },
      el("td", {}, h.hostname),
      el("td", {}, badge(h.satisfiable ? "satisfiable" : "not satisfiable", "verdict")),
      el("td", {}, ...h.groups.filter((g) => !g.usable.length).flatMap((g) =>
        g.reasons.map((r) => el("span", { class: "reason", "data-group": String(g.group_id) },
          `group ${g.group_id}: ${r}`)))))), 3, "acceld knows no accelerator.");
  }

  // -- the refresh loop ------------------------------------------------------------------

  function banner(text) {
    $("banner").hidden = !text;
    $("banner").textContent = text || "";
  }

  async function refresh() {
    if (state.busy) return;
    state.busy = true;
    try {
      if (!state.version) state.version = await negotiate();
      const v = state.version;
      const [hosts, devices, deployables, arqs, profiles] = await Promise.all([
        atLeast(v, 2, 4) ? call(API + "/hosts", v) : Promise.resolve(null),
        call(API + "/devices", v), call(API + "/deployables", v), listArqs(v),
        call(API + "/device_profiles", v)]);
      if (profiles.ok) {
        syncOptions($("explain-profile"),
          (profiles.body.device_profiles || []).map((d) => d.name).sort(), "choose a profile");
      }
      const failures = [hosts, devices, deployables, arqs].filter((r) => r && !r.ok);
      if (failures.some((r) => r.status === 401)) {
        banner("The API wants a token: paste a Keystone token above (it stays in this tab only).");
      } else if (failures.some((r) => r.status === 0 || r.status >= 500)) {
        banner("The API is not answering every request; showing what it returned.");
      } else {
        banner("");
      }
      const denied = (r, what) => (r === null ? `Needs API microversion 2.4.` :
        (r.ok ? "" : `${what}: ${r.message} (${r.status}).`));
      note("hosts-note", denied(hosts, "Hosts not shown"));
      note("devices-note", denied(devices, "Devices not shown"));
      note("arqs-note", denied(arqs, "Accelerator requests not shown"));
      const data = shape(hosts && hosts.ok ? hosts.body.hosts : [],
        devices.ok ? devices.body.devices : [], deployables.ok ? deployables.body.deployables : [],
        arqs.ok ? arqs.body.arqs : []);
      data.hostsNote = !(hosts && hosts.ok);
      state.data = data;
      draw();
      if (state.selected) await events();
      $("status").textContent = `Updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.refreshed = String(Date.now());
    } catch (err) {
      banner(`The dashboard could not draw the fleet: ${err && err.message ? err.message : err}`);
    } finally {
      state.busy = false;
    }
  }

  function schedule() {
    clearTimeout(state.timer);
    const seconds = Number($("refresh").value);
    if (seconds > 0) state.timer = setTimeout(async () => { await refresh(); schedule(); }, seconds * 1000);
  }

  function start() {
    const asked = query.get("refresh");
    if (asked && [...$("refresh").options].some((o) => o.value === asked)) $("refresh").value = asked;
    $("token").value = state.token;
    $("controls").addEventListener("submit", (event) => {
      event.preventDefault();
      state.token = $("token").value.trim();
      if (state.token) sessionStorage.setItem("acceld.token", state.token);
      else sessionStorage.removeItem("acceld.token");
      state.version = null;
      refresh();
    });
    $("filter-host").addEventListener("change", () => { draw(); explain(); });
    $("filter-type").addEventListener("change", draw);
    $("refresh").addEventListener("change", schedule);
    $("explain-form").addEventListener("submit", (event) => { event.preventDefault(); explain(); });
    $("explain-profile").addEventListener("change", explain);
    refresh().finally(schedule);
  }

  start();
})();
