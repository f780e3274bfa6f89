/* harnessrl trajectory viewer: plain JavaScript, no framework, no network.
 *
 * Data: index.html embeds a small summary (harnesses, families, classes, the list of index pages).
 * Episode summaries come in pages (episodes/index-NNN.js, 500 per page) and each episode's detail
 * in its own file (episodes/<id>.js). Every data file is a script that calls
 *     window.__hr_data(key, data)
 * and is loaded with a <script src> tag: that works from file:// (where Chromium refuses fetch())
 * and over http alike. Pages load lazily: first paint needs only the first page; a filter loads
 * further pages one at a time until it has enough matches to show.
 *
 * All text from the run (prompts, completions, tool output) goes into the page with textContent,
 * never innerHTML: model output is data, not markup.
 */
(function () {
  "use strict";

  var summary = JSON.parse(document.getElementById("hr-summary").textContent);
  var ROWS = 200; // rows shown per "show more"
  var classInfo = {};
  summary.classes.forEach(function (c) { classInfo[c.name] = c; });

  // ---- loading data files --------------------------------------------------------------------
  var waiting = {};
  var cache = {};
  window.__hr_data = function (key, data) {
    var w = waiting[key];
    if (w) { delete waiting[key]; w.resolve(data); }
  };
  function load(path) {
    var key = path.replace(/\.js$/, "");
    if (!cache[key]) {
      cache[key] = new Promise(function (resolve, reject) {
        waiting[key] = { resolve: resolve, reject: reject };
        var s = document.createElement("script");
        s.src = path;
        s.async = true;
        s.onload = function () {
          s.remove();
          if (waiting[key]) { delete waiting[key]; delete cache[key]; reject(new Error(path + " did not deliver its data")); }
        };
        s.onerror = function () {
          s.remove(); delete waiting[key]; delete cache[key];
          reject(new Error("cannot load " + path));
        };
        document.head.appendChild(s);
      });
    }
    return cache[key];
  }

  // ---- small DOM helpers ---------------------------------------------------------------------
  function el(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) return;
        if (k === "text") node.textContent = v;
        else if (k === "cls") node.className = v;
        else if (k.slice(0, 2) === "on") node.addEventListener(k.slice(2), v);
        else node.setAttribute(k, v);
      });
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined || c === false) continue;
      if (Array.isArray(c)) c.forEach(function (x) { if (x) node.appendChild(typeof x === "string" ? document.createTextNode(x) : x); });
      else node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return node;
  }
  function pre(text, cls) { return el("pre", { cls: cls || null, text: text }); }
  function fmt(x, digits) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits === undefined ? 2 : digits); }
  function classBadge(name) {
    if (!name) return el("span", { cls: "badge pass", text: "passed" });
    var info = classInfo[name] || { kind: "infra", color: "#999" };
    return el("span", { cls: "badge cls " + info.kind, style: "--c:" + info.color, text: name });
  }

  // ---- filters and the episode list ------------------------------------------------------------
  var form = document.getElementById("filters");
  var tbody = document.querySelector("#episode-list tbody");
  var status = document.getElementById("list-status");
  var moreButton = document.getElementById("more");
  var detail = document.getElementById("detail");

  function fillSelect(name, values, label) {
    var sel = form.elements[name];
    values.forEach(function (v) { sel.appendChild(el("option", { value: v, text: label ? label(v) : v })); });
  }
  if (summary.runs.length > 1) fillSelect("run", summary.runs.map(function (r) { return r.label; }), function (l) { return "run " + l; });
  else form.querySelector(".run-filter").hidden = true;
  fillSelect("harness", summary.harnesses);
  fillSelect("cls", summary.classes.map(function (c) { return c.name; }), function (n) { return classInfo[n].kind + ": " + n; });
  fillSelect("family", summary.families);

  var state = { rows: [], nextPage: 0, limit: ROWS, selected: null, generation: 0, pageLoading: null };

  function filters() {
    var f = form.elements;
    return { run: f.run.value, harness: f.harness.value, outcome: f.outcome.value, cls: f.cls.value, family: f.family.value, task: f.task.value.trim().toLowerCase() };
  }
  function matcher() {
    var f = filters();
    return function (e) {
      if (f.run && e.run !== f.run) return false;
      if (f.harness && e.harness !== f.harness) return false;
      if (f.outcome === "passed" && !e.passed) return false;
      if (f.outcome === "failed" && e.passed) return false;
      if (f.cls && e["class"] !== f.cls) return false;
      if (f.family && e.family !== f.family) return false;
      if (f.task && e.task.toLowerCase().indexOf(f.task) < 0) return false;
      return true;
    };
  }

  function loadNextPage() {
    if (!state.pageLoading) {
      var i = state.nextPage;
      state.pageLoading = load(summary.pages[i]).then(function (page) {
        Array.prototype.push.apply(state.rows, page.episodes);
        state.nextPage = i + 1;
        state.pageLoading = null;
      }, function (err) { state.pageLoading = null; throw err; });
    }
    return state.pageLoading;
  }

  function renderList() {
    var ok = matcher();
    var shown = 0, total = 0;
    var frag = document.createDocumentFragment();
    for (var i = 0; i < state.rows.length; i++) {
      var e = state.rows[i];
      if (!ok(e)) continue;
      total++;
      if (shown >= state.limit) continue;
      shown++;
      frag.appendChild(listRow(e));
    }
    tbody.replaceChildren(frag);
    var all = state.nextPage >= summary.pages.length;
    if (summary.n_episodes === 0) status.textContent = "This run has no episodes yet.";
    else if (state.nextPage === 0) status.textContent = "loading episodes...";
    else status.textContent = (all ? total : "at least " + total) + " matching episode" + (total === 1 ? "" : "s") +
      (shown < total ? ", showing the first " + shown : "") +
      (all ? "" : " (read " + state.rows.length + " of " + summary.n_episodes + ")");
    moreButton.hidden = shown >= total && all;
    return total;
  }

  function listRow(e) {
    var mark = e["class"] === "infra" ? "!" : e.passed ? "\u2713" : "\u2717";
    var tr = el("tr", { cls: (e.passed ? "ok" : "fail") + (state.selected === e.file ? " selected" : ""), "data-file": e.file, tabindex: "0" },
      el("td", { cls: "mark", text: mark }),
      el("td", { text: (e.run ? e.run + " \u00b7 " : "") + e.harness }),
      el("td", { cls: "task", text: e.task, title: e.family }),
      el("td", { cls: "num", text: String(e.attempt) }),
      el("td", { cls: "num", text: fmt(e.score) }),
      el("td", null, e["class"] ? classBadge(e["class"]) : null),
      el("td", { cls: "num", text: String(e.n_steps) }),
      el("td", { text: e.termination || "-" }));
    return tr;
  }

  async function update(resetLimit) {
    var gen = ++state.generation;
    if (resetLimit) state.limit = ROWS;
    try {
      // Read further pages only while the loaded ones do not fill the view.
      while (renderList() < state.limit && state.nextPage < summary.pages.length) {
        await loadNextPage();
        if (gen !== state.generation) return;
      }
    } catch (err) {
      status.textContent = "Cannot read the episode list: " + err.message;
    }
  }

  form.addEventListener("change", function () { update(true); });
  var typing = null;
  form.elements.task.addEventListener("input", function () { clearTimeout(typing); typing = setTimeout(function () { update(true); }, 150); });
  form.addEventListener("submit", function (ev) { ev.preventDefault(); });
  moreButton.addEventListener("click", function () { state.limit += ROWS; update(false); });
  tbody.addEventListener("click", function (ev) {
    var tr = ev.target.closest("tr[data-file]");
    if (tr) openFile(tr.getAttribute("data-file"));
  });
  tbody.addEventListener("keydown", function (ev) {
    var tr = ev.target.closest("tr[data-file]");
    if (!tr) return;
    if (ev.key === "Enter") openFile(tr.getAttribute("data-file"));
    if (ev.key === "ArrowDown" && tr.nextElementSibling) { ev.preventDefault(); tr.nextElementSibling.focus(); }
    if (ev.key === "ArrowUp" && tr.previousElementSibling) { ev.preventDefault(); tr.previousElementSibling.focus(); }
  });

  // Links in the overview tables (harness names, triage counts) set the filters.
  document.addEventListener("click", function (ev) {
    var a = ev.target.closest("a[data-harness]");
    if (!a) return;
    var f = form.elements;
    f.harness.value = a.getAttribute("data-harness");
    f.run.value = a.getAttribute("data-run") || "";
    f.cls.value = a.getAttribute("data-class") || "";
    f.outcome.value = a.getAttribute("data-class") ? "failed" : "";
    f.family.value = ""; f.task.value = "";
    update(true);
  });

  // ---- one episode ---------------------------------------------------------------------------
  function openFile(file) {
    var key = file.replace(/^episodes\//, "").replace(/\.js$/, "");
    if (location.hash === "#episode/" + key) showEpisode(file);
    else location.hash = "episode/" + key;
  }
  function route() {
    var m = /^#episode\/(.+)$/.exec(location.hash);
    if (m) showEpisode("episodes/" + decodeURIComponent(m[1]) + ".js");
  }
  window.addEventListener("hashchange", route);

  async function showEpisode(file) {
    state.selected = file;
    Array.prototype.forEach.call(tbody.querySelectorAll("tr.selected"), function (tr) { tr.classList.remove("selected"); });
    var row = tbody.querySelector('tr[data-file="' + CSS.escape(file) + '"]');
    if (row) row.classList.add("selected");
    detail.replaceChildren(el("p", { cls: "hint", text: "loading " + file + " ..." }));
    var ep;
    try { ep = await load(file); } catch (err) {
      detail.replaceChildren(el("p", { cls: "error", text: err.message }));
      return;
    }
    if (state.selected !== file) return;
    detail.replaceChildren(renderEpisode(ep));
    detail.scrollTop = 0;
  }

  function verdictBox(v, cls, withJump) {
    var info = classInfo[v["class"]] || { kind: v.kind, color: "#999" };
    return el("div", { cls: "verdict " + cls + " " + info.kind, style: "--c:" + info.color },
      el("span", { cls: "verdict-label", text: "Triage verdict" }), " ",
      classBadge(v["class"]), " ",
      el("span", { cls: "kind", text: info.kind === "process" ? "process failure: fix the harness" : info.kind === "content" ? "content failure: fix the weights" : "infrastructure error" }),
      v.step === null || v.step === undefined ? null : el("span", { cls: "at" }, " at ",
        withJump ? el("a", { href: "#", onclick: function (ev) { ev.preventDefault(); var s = document.getElementById("step-" + v.step); if (s) s.scrollIntoView({ block: "start", behavior: "smooth" }); }, text: "step " + v.step }) : "step " + v.step),
      el("div", { cls: "evidence", text: v.evidence }));
  }

  function kv(label, value, cls) { return el("span", { cls: "kv " + (cls || "") }, el("b", { text: label }), " ", value); }

  function renderEpisode(ep) {
    var g = ep.grade;
    var passed = g && g.passed;
    var head = el("div", { cls: "ep-head" },
      el("h3", null, (ep.run ? "run " + ep.run + " \u00b7 " : "") + ep.harness + " \u00b7 " + ep.task + " \u00b7 attempt " + ep.attempt),
      el("div", { cls: "facts" },
        el("span", { cls: "badge " + (passed ? "pass" : "fail"), text: passed ? "passed" : ep.termination === "error" ? "infra error" : "failed" }),
        kv("score", g ? fmt(g.score) + " / threshold " + fmt(g.threshold) : "not graded"),
        kv("end", ep.termination + (ep.termination_detail ? " (" + ep.termination_detail + ")" : "")),
        kv("steps", String(ep.steps.length)),
        kv("family", ep.family),
        kv("tokens", ep.prompt_tokens + " prompt / " + ep.completion_tokens + " completion"),
        kv("time", fmt(ep.duration_s, 1) + " s"),
        ep.retries ? kv("retries", String(ep.retries)) : null),
      ep.verdict ? verdictBox(ep.verdict, "verdict-top", true) : null,
      el("div", { cls: "block" }, el("div", { cls: "label", text: "instruction" }), pre(ep.instruction)),
      ep.time ? renderTime(ep.time) : null,
      g ? renderGrade(g) : null,
      ep.submitted ? el("div", { cls: "block" }, el("div", { cls: "label", text: "submitted answer" }), pre(ep.answer === null ? "(none)" : ep.answer)) : null,
      ep.infra_error ? el("div", { cls: "block error" }, el("div", { cls: "label", text: "infrastructure error" }), pre(ep.infra_error)) : null,
      ep.refused_requests && ep.refused_requests.length ? el("div", { cls: "block error" }, el("div", { cls: "label", text: "refused requests" }), pre(ep.refused_requests.join("\n"))) : null,
      ep.meta ? el("details", null, el("summary", { text: "episode meta" }), pre(ep.meta)) : null,
      el("p", { cls: "sub", text: ep.id }));

    var steps = el("ol", { cls: "steps" });
    var prompt = [];
    ep.steps.forEach(function (s) {
      var prev = prompt;
      prompt = prev.slice(0, s.prompt_prefix).concat(s.messages);
      steps.appendChild(renderStep(s, prompt, ep.verdict));
    });
    if (!ep.steps.length) steps.appendChild(el("li", { cls: "hint", text: "no model call was made" }));
    return el("div", { cls: "episode" }, head, el("h4", { text: "Steps" }), steps);
  }

  // where the episode's time went: one bar of parts adding up to its wall clock (episodes.py
  // time_breakdown says what each part is), then the same numbers as a table
  var TIME_COLORS = { queue: "#b0b7c3", prefill: "#4c78a8", decode: "#72b7b2", "model, other": "#9d755d", model: "#9d755d", "tools, setup, grading": "#f58518", waiting: "#e0e0e0" };
  function renderTime(t) {
    var total = t.parts.reduce(function (a, p) { return a + p.s; }, 0) || 1;
    var bar = el("div", { cls: "time-bar" }, t.parts.map(function (p) {
      return el("span", { cls: "time-part", title: p.part + ": " + fmt(p.s, 3) + " s", style: "width:" + (100 * p.s / total).toFixed(2) + "%;background:" + (TIME_COLORS[p.part] || "#999") });
    }));
    var rows = t.parts.map(function (p) {
      return el("tr", null, el("th", null, el("span", { cls: "swatch", style: "background:" + (TIME_COLORS[p.part] || "#999") }), " " + p.part),
        el("td", { cls: "num", text: fmt(p.s, 3) + " s" }), el("td", { cls: "num", text: fmt(100 * p.s / total, 0) + "%" }));
    });
    return el("div", { cls: "block time" }, el("div", { cls: "label", text: "where the time went" }), bar,
      el("table", { cls: "subscores time-table" }, el("tbody", null, rows)),
      t.n_calls_timed < t.n_calls ? el("div", { cls: "sub", text: t.n_calls_timed + " of " + t.n_calls + " model calls were timed" }) : null);
  }
  function stepTime(tm) {
    if (!tm || tm.latency === undefined) return null;
    var inner = ["queue", "prefill", "decode", "ttft"].filter(function (k) { return tm[k] !== undefined; })
      .map(function (k) { return k + " " + fmt(tm[k], 3); });
    return el("span", { cls: "sub", text: "model " + fmt(tm.latency, 3) + " s" + (inner.length ? " (" + inner.join(", ") + ")" : "") });
  }

  function renderGrade(g) {
    var subs = Object.keys(g.subscores || {});
    return el("div", { cls: "block grade" }, el("div", { cls: "label", text: "grade" }),
      el("div", null, kv("score", fmt(g.score, 3)), kv("passed", g.passed ? "yes" : "no", g.passed ? "good" : "bad"), kv("threshold", fmt(g.threshold))),
      subs.length ? el("table", { cls: "subscores" }, el("tbody", null, subs.map(function (k) {
        return el("tr", null, el("th", { text: k }), el("td", { cls: "num", text: fmt(g.subscores[k], 3) }));
      }))) : null,
      g.details ? el("details", null, el("summary", { text: "grader details" }), pre(g.details)) : null);
  }

  function renderStep(s, messages, verdict) {
    var isVerdict = verdict && verdict.step === s.index;
    var li = el("li", { cls: "step" + (isVerdict ? " verdict-step" : ""), id: "step-" + s.index });
    li.appendChild(el("div", { cls: "step-head" },
      el("span", { cls: "step-no", text: "step " + s.index }),
      el("span", { cls: "badge action " + s.action, text: s.action }),
      s.finish_reason !== "stop" ? el("span", { cls: "badge warn", text: "finish: " + s.finish_reason }) : null,
      s.n_completion_tokens || s.n_prompt_tokens ? el("span", { cls: "sub", text:
        (s.n_prompt_tokens ? s.n_prompt_tokens + " prompt tokens, " : "") + (s.n_completion_tokens || 0) + " completion tokens" }) : null,
      stepTime(s.timings)));
    if (isVerdict) li.appendChild(verdictBox(verdict, "verdict-banner", false));

    var fresh = messages.length - s.prompt_prefix;
    var details = el("details", { cls: "prompt" }, el("summary", { text: "prompt: " + messages.length + " messages (" + fresh + " new since the previous step)" }));
    details.addEventListener("toggle", function () {
      if (!details.open || details.dataset.done) return;
      details.dataset.done = "1";
      messages.forEach(function (m, i) {
        details.appendChild(el("div", { cls: "msg role-" + m.role + (i >= s.prompt_prefix ? " new" : "") },
          el("div", { cls: "role", text: m.role + (m.name ? " (" + m.name + ")" : "") }), pre(m.content)));
      });
    });
    li.appendChild(details);

    li.appendChild(el("div", { cls: "block" }, el("div", { cls: "label", text: "completion" }), pre(s.completion || "(empty)")));

    var action = el("div", { cls: "block" }, el("div", { cls: "label", text: "parsed action" }));
    if (s.tool_calls.length) {
      s.tool_calls.forEach(function (c) {
        action.appendChild(el("div", { cls: "call" }, el("code", { cls: "tool", text: c.name }), pre(c.arguments, "args")));
      });
    } else if (s.parse_error) {
      action.appendChild(el("div", { cls: "parse-error" }, el("b", { text: "parse error: " }), s.parse_error));
    } else {
      action.appendChild(el("div", { cls: "sub", text: s.action === "text" ? "prose reply, taken as the final answer" : s.action === "plan" ? "plan turn" : "no tool call" }));
    }
    li.appendChild(action);

    if (s.tool_results.length) {
      var results = el("div", { cls: "block" }, el("div", { cls: "label", text: "tool results" }));
      s.tool_results.forEach(function (r) {
        results.appendChild(el("div", { cls: "result" + (r.blocked ? " blocked" : r.ok ? "" : " failed") },
          el("div", null, el("code", { cls: "tool", text: r.name }), " ",
            r.blocked ? el("span", { cls: "badge blocked", text: "BLOCKED: " + r.blocked }) : el("span", { cls: "badge " + (r.ok ? "pass" : "fail"), text: r.ok ? "ok" : "error" })),
          pre(r.output),
          r.full_output ? el("details", null, el("summary", { text: "full output (the model saw the shortened one above)" }), pre(r.full_output)) : null));
      });
      li.appendChild(results);
    }
    if (s.interventions.length) {
      var ivs = el("div", { cls: "block" }, el("div", { cls: "label", text: "guard interventions" }));
      s.interventions.forEach(function (iv) {
        ivs.appendChild(el("div", { cls: "intervention" }, el("span", { cls: "badge guard", text: iv.kind }), pre(iv.message || "")));
      });
      li.appendChild(ivs);
    }
    return li;
  }

  // ---- start -----------------------------------------------------------------------------------
  update(true);
  route();
})();
