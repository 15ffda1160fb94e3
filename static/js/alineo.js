/* Alineo dashboard: relative times, per-form Idempotency-Keys, a busy check for
   polled fragments, the live tree and the live transcript.

   The tree: each workspace's list is drawn with its cursor (data-cursor, the
   tree seq) and follows /api/workspaces/{name}/stream from it. A `node` event
   is one agent's node drawn by the server (the page's own template): it
   replaces the old one, or goes under its parent; `tree` is every node (draw
   again). A node the operator is using (a form open, a field focused) is
   updated once they leave it.

   The transcript: the page is drawn with its latest page and its cursor
   (data-cursor, the last seq rendered). A fetch-based SSE reader follows
   /api/agents/{id}/stream from that cursor (Last-Event-ID and ?after=), and
   every event only tells us how far the transcript goes; the rows themselves
   are fetched as the same server-rendered fragment the page used
   (rows?after=<cursor>), so rows are keyed by seq (id="row-<seq>") and a
   reconnect can neither duplicate nor skip one. Older pages load on scroll-up
   (rows?before=<first>) keeping the reading position. */
(function () {
  "use strict";
  var A = (window.alineo = {});

  // --- relative times ----------------------------------------------------------
  // As sessions/templatetags/alineo.py relative(): the past floored to its unit,
  // the future as what is left (an expiry 5.99 days away is "in 5 d 23 h", not "in 5 d").
  function rel(ms) {
    var s = (Date.now() - ms) / 1000, future = s < 0; s = Math.abs(s);
    if (s < 5) return "just now";
    if (future) return "in " + timeLeft(s);
    var n, u;
    if (s < 60) { n = Math.floor(s); u = "s"; }
    else if (s < 3600) { n = Math.floor(s / 60); u = "min"; }
    else if (s < 86400) { n = Math.floor(s / 3600); u = "h"; }
    else { n = Math.floor(s / 86400); u = "d"; }
    return n + " " + u + " ago";
  }
  function timeLeft(s) {
    if (s < 60) return Math.floor(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s >= 7 * 86400) return Math.round(s / 86400) + " d";
    var h = Math.floor(s / 3600), d = Math.floor(h / 24); h = h % 24;
    return [d ? d + " d" : "", h ? h + " h" : ""].filter(Boolean).join(" ");
  }
  function elapsed(ms) {
    var s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
    return s >= 60 ? Math.floor(s / 60) + " min " + (s % 60) + " s" : s + " s";
  }
  A.refreshTimes = function (root) {
    (root || document).querySelectorAll("time[data-rel]").forEach(function (t) {
      var ms = Date.parse(t.dateTime); if (!isNaN(ms)) t.textContent = rel(ms);
    });
    var stopped = document.body && document.body.classList.contains("server-away");
    (root || document).querySelectorAll("time[data-elapsed]").forEach(function (t) {
      t.classList.toggle("stopped", stopped);  // a timer we cannot vouch for does not run
      var ms = Date.parse(t.dateTime); if (!isNaN(ms) && !stopped) t.textContent = elapsed(ms);
    });
  };
  setInterval(function () { A.refreshTimes(document); }, 5000);

  // --- polled fragments wait while the operator is typing or has a form open ---
  // (A listener, not an hx-trigger filter: htmx evaluates filters with eval,
  // which the Content-Security-Policy forbids; htmx.config.allowEval is off.)
  A.busy = function (el) {
    var a = document.activeElement;
    if (a && el.contains(a) && a.matches("input, textarea, select")) return true;
    return !!el.querySelector("details[open]");
  };
  document.addEventListener("htmx:beforeRequest", function (e) {
    var el = e.detail.elt;
    if (el && el.matches && el.matches("[data-poll-when-idle]") && A.busy(el)) e.preventDefault();
  });
  // A poll sent a moment before the operator started typing answers after: its
  // redraw waits for the next poll too.
  document.addEventListener("htmx:beforeSwap", function (e) {
    var el = e.detail.target;
    if (el && el.matches && el.matches("[data-poll-when-idle]") && A.busy(el)) e.detail.shouldSwap = false;
  });
  // What the operator typed and has not sent survives any redraw of its form
  // (a reason for an approval, a steer typed, then a click elsewhere): kept
  // by the field's id, put back into the redrawn field while it is empty, and
  // forgotten once its form was sent.
  var drafts = {};
  document.addEventListener("input", function (e) {
    var t = e.target;
    if (t && t.id && t.matches && t.matches("textarea")) drafts[t.id] = t.value;
  });
  function forgetDrafts(form) {
    Array.prototype.forEach.call(form.querySelectorAll("textarea[id]"), function (t) { delete drafts[t.id]; });
  }
  A.restoreDrafts = function () {
    Object.keys(drafts).forEach(function (id) {
      var t = document.getElementById(id);
      if (t && t.matches("textarea") && !t.value && drafts[id]) t.value = drafts[id];
    });
  };
  document.addEventListener("submit", function (e) {
    // A plain form leaves the page; an htmx one is forgotten once answered (below).
    if (e.target && !e.target.hasAttribute("hx-post")) forgetDrafts(e.target);
  });
  document.addEventListener("htmx:beforeSwap", function (e) {
    // Before its answer redraws the form, or the draft would come back in it.
    // (htmx puts the element that sent the request in requestConfig here.)
    var elt = e.detail.requestConfig && e.detail.requestConfig.elt;
    var form = elt && elt.closest ? elt.closest("form") : null;
    if (form && e.detail.xhr && e.detail.xhr.status < 300) forgetDrafts(form);
  });
  ["htmx:afterSwap", "htmx:oobAfterSwap"].forEach(function (name) {
    document.addEventListener(name, A.restoreDrafts);
  });

  // --- honest when the server is away ------------------------------------------
  // While the transcript's or the tree's stream is down or a poll gets no answer: a banner,
  // commands disabled, timers stopped, statuses greyed (body.server-away). A
  // command whose request got no answer says it was not sent.
  var away = {stream: false, tree: false, poll: false};
  A.setAway = function (source, isAway) {
    away[source] = isAway;
    var on = away.stream || away.tree || away.poll;
    document.body.classList.toggle("server-away", on);
    var banner = document.getElementById("server-banner");
    if (banner) banner.hidden = !on || (away.stream && !!document.getElementById("stream-banner"));
    document.querySelectorAll(".actions button, .actions textarea").forEach(function (el) {
      if (on && !el.disabled) { el.disabled = true; el.dataset.awayDisabled = "1"; }
      else if (!on && el.dataset.awayDisabled) { el.disabled = false; delete el.dataset.awayDisabled; }
    });
    A.refreshTimes(document);
  };
  function notSent(form) {
    var actions = form.closest(".actions");
    // The live poll may have redrawn the buttons meanwhile: say it where they are now.
    if (actions && actions.id && !document.contains(actions)) actions = document.getElementById(actions.id);
    if (!actions) return false;
    actions.querySelectorAll(":scope > .note").forEach(function (n) { n.remove(); });
    var p = document.createElement("p");
    p.className = "note note-error small"; p.setAttribute("role", "alert");
    p.textContent = "Not sent: the server did not answer. Nothing was done; try again when it is back.";
    actions.appendChild(p);
    return true;
  }
  // Heard on the form itself, not on document: htmx fires a request's events on
  // the element that sent it, and from a form no longer in the page (a redraw
  // took it out) they never bubble up to document. No answer is still said.
  document.addEventListener("htmx:beforeRequest", function (e) {
    var form = e.detail.elt.closest ? e.detail.elt.closest("form") : null;
    if (!form || form.dataset.answerWatched) return;
    form.dataset.answerWatched = "1";
    ["htmx:sendError", "htmx:timeout"].forEach(function (name) {
      form.addEventListener(name, function () { notSent(form); A.setAway("poll", true); });
    });
  });
  document.addEventListener("htmx:sendError", function () { A.setAway("poll", true); });
  document.addEventListener("htmx:afterRequest", function (e) {
    var xhr = e.detail.xhr;
    if (xhr && xhr.status > 0 && xhr.status < 500) A.setAway("poll", false);
  });

  // --- habits: Ctrl/Cmd+Enter sends the form being typed in ----------------------
  document.addEventListener("keydown", function (e) {
    if (e.key !== "Enter" || !(e.ctrlKey || e.metaKey)) return;
    var t = e.target;
    if (!t || !t.matches || !t.matches("textarea")) return;
    var form = t.closest("form"), send = form && form.querySelector("button[type=submit]");
    if (!send || send.disabled) return;
    e.preventDefault();
    if (form.requestSubmit) form.requestSubmit(send); else send.click();
  });
  // The composer keeps its place under the transcript: emptied once its prompt was taken.
  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt.closest ? e.detail.elt.closest("form.composer-form") : null;
    if (form && e.detail.successful && e.detail.xhr.status < 300) {
      var text = form.querySelector("textarea"); if (text) text.value = "";
    }
  });

  // --- Idempotency-Key: one per drawn form; a double click sends it twice -----
  function newKey() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return "k-" + Date.now().toString(36) + "-" + Math.random().toString(36).slice(2);
  }
  document.addEventListener("htmx:configRequest", function (e) {
    var form = e.detail.elt.closest ? e.detail.elt.closest("form") : null;
    var input = form && form.querySelector("input[name=idempotency_key]");
    if (input && input.value) e.detail.headers["Idempotency-Key"] = input.value;
  });
  document.addEventListener("htmx:afterRequest", function (e) {
    // A form left in place after an answer is a new action next time.
    var form = e.detail.elt.closest ? e.detail.elt.closest("form") : null;
    var input = form && document.contains(form) && form.querySelector("input[name=idempotency_key]");
    if (input && e.detail.successful) input.value = newKey();
  });
  document.addEventListener("htmx:afterSwap", function (e) { A.refreshTimes(e.detail.target); });
  // The agent page's live poll redraws the buttons out of band as the status
  // moves (Steer only while a turn runs): not while the operator uses them, and
  // the answer to their last command stays.
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var target = e.detail.target, fresh = e.detail.fragment && e.detail.fragment.firstElementChild;
    if (!target || !target.classList) return;
    if (A.busy(target)) { e.preventDefault(); return; }  // a form open or focused there
    if (!target.classList.contains("actions")) return;
    // A command of its own in flight: its answer redraws these buttons (a redraw
    // now would take its form out of the page and lose the answer).
    if (target.querySelector(".htmx-request")) { e.preventDefault(); return; }
    var note = target.querySelector(":scope > .note");
    if (note && fresh && !fresh.querySelector(".note")) fresh.appendChild(note.cloneNode(true));
  });

  // --- the transcript by turns (sessions/dashboard/transcript.py) ---------------
  // Rows stay one per seq; these fold them for reading, whatever order they
  // arrived in (the page, live rows, older pages): a run's streamed chunks into
  // its first row (the final text replaces them), a tool result into its call.
  function all(root, sel) { return Array.prototype.slice.call(root.querySelectorAll(sel)); }
  function quoted(v) { return '"' + (window.CSS && CSS.escape ? CSS.escape(v) : v.replace(/["\\]/g, "")) + '"'; }
  A.stitch = function (list, run) {
    var rows = all(list, "li[data-run=" + quoted(run) + "]"), text = "", final = null;
    rows.forEach(function (li) {
      var chunk = li.querySelector(".chunk"); chunk = chunk ? chunk.textContent : "";
      if (li.dataset.final === "1") final = chunk; else text += chunk;
    });
    rows.forEach(function (li, i) {
      li.classList.toggle("run-head", i === 0); li.classList.toggle("merged", i > 0);
      var box = li.querySelector(".msg-text");
      if (box) box.textContent = i === 0 ? (final !== null ? final : text) : "";
    });
  };
  function took(ms) { return ms < 1000 ? Math.max(0, Math.round(ms)) + " ms" : (ms / 1000).toFixed(1) + " s"; }
  A.pair = function (list, id) {
    var call = list.querySelector("li[data-call=" + quoted(id) + "]");
    var result = list.querySelector("li[data-result-of=" + quoted(id) + "]");
    if (!call || !result) return;
    var slot = call.querySelector(".tool-slot");
    if (!slot || slot.dataset.filled === result.dataset.seq) return;
    // The bridge's own times of the call and its result when both rows have
    // them: a call and its result relayed in one page share one commit time.
    var ms = Date.parse(result.dataset.bts) - Date.parse(call.dataset.bts);
    if (isNaN(ms) || ms < 0) ms = Date.parse(result.dataset.ts) - Date.parse(call.dataset.ts);
    var dur = result.querySelector(".duration"); if (dur && !isNaN(ms)) dur.textContent = "took " + took(ms);
    var box = document.createElement("div");
    box.className = "tool-result" + (result.classList.contains("failed") ? " failed" : "");
    var line = document.createElement("div"); line.className = "small tool-status";
    var meta = result.querySelector(".meta");
    line.textContent = "#" + result.dataset.seq + " result" + (meta ? " · " + meta.textContent : "") +
                       (dur && dur.textContent ? " · " + dur.textContent : "");
    box.appendChild(line);
    var blocks = result.querySelector(".blocks"); if (blocks) box.appendChild(blocks.cloneNode(true));
    slot.innerHTML = ""; slot.appendChild(box); slot.dataset.filled = result.dataset.seq;
    result.classList.add("merged");
  };
  A.fold = function (list, added) {
    var runs = {}, calls = {};
    added.forEach(function (li) {
      if (li.dataset.run) runs[li.dataset.run] = 1;
      if (li.dataset.call) calls[li.dataset.call] = 1;
      if (li.dataset.resultOf) calls[li.dataset.resultOf] = 1;
    });
    Object.keys(runs).forEach(function (r) { A.stitch(list, r); });
    Object.keys(calls).forEach(function (c) { A.pair(list, c); });
  };
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("[data-copy]");
    if (!button) return;
    var pre = button.parentElement.querySelector("pre"), text = pre ? pre.textContent : "";
    function done(ok) { button.textContent = ok ? "Copied" : "Copy failed: select the text"; }
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(false); });
    } else { done(false); }
  });
  function systemToggle(box) {
    var toggle = document.getElementById("show-system");
    if (!toggle) return;
    var saved = null;
    try { saved = localStorage.getItem("alineo.showSystem"); } catch (err) { /* private mode */ }
    toggle.checked = saved === "1";
    function apply() {
      box.classList.toggle("show-sys", toggle.checked);
      try { localStorage.setItem("alineo.showSystem", toggle.checked ? "1" : "0"); } catch (err) { /* ignore */ }
    }
    toggle.addEventListener("change", apply); apply();
  }

  // Opt-in browser notifications when a turn ends (or the agent is lost), for
  // rows that arrive live; the page's own rows never notify.
  var ENDS = {"turn.finished": "finished", "turn.interrupted": "was interrupted", "agent.lost": "is lost"};
  function notifyOn() {
    try { return localStorage.getItem("alineo.notify") === "1" && Notification.permission === "granted"; }
    catch (err) { return false; }
  }
  function notifyToggle() {
    var button = document.getElementById("notify-toggle");
    if (!button || !("Notification" in window)) return;
    function label() { button.textContent = notifyOn() ? "Notifications on (turn ends)" : "Notify me when a turn ends"; }
    button.hidden = false; label();
    button.addEventListener("click", function () {
      if (notifyOn()) { localStorage.setItem("alineo.notify", "0"); label(); return; }
      Promise.resolve(Notification.requestPermission()).then(function (p) {
        if (p === "granted") localStorage.setItem("alineo.notify", "1");
        label();
      });
    });
  }
  A.notifyEnds = function (box, added) {
    if (!notifyOn()) return;
    added.forEach(function (li) {
      var what = ENDS[li.dataset.type];
      if (!what) return;
      var turn = li.dataset.turn ? "Turn " + li.dataset.turn + " " : "";
      new Notification((turn || "The agent ") + what + " · " + box.dataset.agent, {tag: "alineo-" + li.dataset.seq});
    });
  };

  // --- server-sent events over fetch (every event type, our own reconnects) --------
  // handlers: open(), event(id, type, data), status(code, body) -> true when handled
  A.follow = function (url, cursor, handlers) {
    var delay = 500;
    function retry() {
      handlers.state("reconnecting");
      setTimeout(connect, delay); delay = Math.min(delay * 2, 4000);
    }
    function connect() {
      var u = new URL(url, location.href), at = String(cursor());
      u.searchParams.set("after", at);
      fetch(u, {credentials: "same-origin", cache: "no-store",
                headers: {"Accept": "text/event-stream", "Last-Event-ID": at}})
        .then(function (resp) {
          if (resp.status === 401) {
            location.href = "/accounts/login/?next=" + encodeURIComponent(location.pathname); return;
          }
          if (resp.status === 404) { handlers.state("gone"); return; }
          if (resp.status === 429) {  // quota.streams: say so, and try again slowly
            return resp.json().catch(function () { return {}; }).then(function (body) {
              handlers.state("quota", body.message || "Too many open streams.");
              setTimeout(connect, 10000);
            });
          }
          if (!resp.ok || !resp.body) throw new Error("HTTP " + resp.status);
          handlers.state("live"); delay = 500;
          if (handlers.open) handlers.open();
          var reader = resp.body.getReader(), dec = new TextDecoder(), buf = "";
          function read() {
            return reader.read().then(function (r) {
              if (r.done) throw new Error("stream ended");
              buf += dec.decode(r.value, {stream: true}).replace(/\r\n?/g, "\n");
              var i;
              while ((i = buf.indexOf("\n\n")) >= 0) {
                var block = buf.slice(0, i); buf = buf.slice(i + 2);
                var id = null, type = "message", data = [];
                block.split("\n").forEach(function (line) {
                  if (line.indexOf("id:") === 0) id = line.slice(3).trim();
                  else if (line.indexOf("event:") === 0) type = line.slice(6).trim();
                  else if (line.indexOf("data:") === 0) data.push(line.slice(5).replace(/^ /, ""));
                });
                if (id !== null && /^[0-9]+$/.test(id)) handlers.event(parseInt(id, 10), type, data.join("\n"));
              }
              return read();
            });
          }
          return read();
        })
        .catch(retry);
    }
    connect();
  };

  // --- the live tree -----------------------------------------------------------------
  function LiveTree(box) {
    var self = this;
    self.box = box;
    self.list = box.querySelector("ul.tree");
    self.cursor = parseInt(box.dataset.cursor || "0", 10);
    self.waiting = {};  // agent id -> a node held back while the operator uses the old one
    ["focusout", "toggle", "htmx:afterRequest"].forEach(function (name) {
      box.addEventListener(name, function () { setTimeout(function () { self.release(); }, 0); }, true);
    });
    A.follow(box.dataset.streamUrl, function () { return self.cursor; }, {
      state: function (state) {
        box.dataset.state = state;
        if (state === "reconnecting" || state === "live") A.setAway("tree", state === "reconnecting");
      },
      event: function (id, type, data) {
        var body; try { body = JSON.parse(data); } catch (e) { return; }
        if (type === "node") self.put(body);
        else if (type === "tree") self.redraw(body.nodes);
        else return;
        self.cursor = id; box.dataset.cursor = String(id);
      }
    });
  }
  LiveTree.prototype.put = function (node) {
    var li = document.getElementById("node-" + node.agent);
    var old = li && li.querySelector(":scope > .node");
    // In use, or a command of its own in flight (its answer goes into this node):
    // the update waits (release(), after the answer).
    if (old && (A.busy(old) || old.querySelector(".htmx-request"))) {
      this.waiting[node.agent] = node; return;
    }
    delete this.waiting[node.agent];
    var t = document.createElement("template"); t.innerHTML = node.html.trim();
    var fresh = t.content.firstElementChild;
    // Drawn once for every viewer: each form here gets a key of its own.
    fresh.querySelectorAll("input[name=idempotency_key]").forEach(function (i) { i.value = newKey(); });
    if (!li) {
      li = document.createElement("li"); li.id = "node-" + node.agent;
      var parent = node.parent && document.getElementById("node-" + node.parent), under = this.list;
      if (parent) {
        under = parent.querySelector(":scope > ul");
        if (!under) under = parent.appendChild(document.createElement("ul"));
      }
      under.appendChild(li);
      var empty = document.getElementById("tree-empty"); if (empty) empty.remove();
    }
    li.dataset.status = node.status;
    if (old) {
      // A command's answer ("Pause sent", "Not sent") outlives the redraw it caused.
      var into = fresh.querySelector(".actions");
      if (into) old.querySelectorAll(".actions > .note").forEach(function (n) { into.appendChild(n); });
      li.replaceChild(fresh, old);
    } else li.insertBefore(fresh, li.firstChild);
    if (window.htmx) htmx.process(fresh);
    A.refreshTimes(fresh);
  };
  LiveTree.prototype.redraw = function (nodes) {
    var keep = {};
    nodes.forEach(function (n) { keep["node-" + n.agent] = true; });
    this.list.querySelectorAll("li[id^=node-]").forEach(function (li) { if (!keep[li.id]) li.remove(); });
    var self = this;
    nodes.forEach(function (n) { self.put(n); });
  };
  LiveTree.prototype.release = function () {
    var self = this;
    Object.keys(self.waiting).forEach(function (id) {
      var li = document.getElementById("node-" + id), old = li && li.querySelector(":scope > .node");
      if (!old || !A.busy(old)) self.put(self.waiting[id]);
    });
  };

  // --- the live transcript -------------------------------------------------------
  function Transcript(box) {
    this.box = box;
    this.rows = box.querySelector("#rows");
    this.banner = document.getElementById("stream-banner");
    this.cursor = parseInt(box.dataset.cursor || "0", 10);   // last seq rendered
    this.head = this.cursor;                                   // last seq the stream announced
    this.first = parseInt(box.dataset.first || "0", 10);
    this.hasOlder = box.dataset.hasOlder === "1";
    this.pulling = false; this.loadingOlder = false;
    this.rowsUrl = box.dataset.rowsUrl; this.streamUrl = box.dataset.streamUrl;
    systemToggle(box); notifyToggle();
    A.fold(this.rows, all(this.rows, "li[data-seq]"));
    box.scrollTop = box.scrollHeight;
    this.watchOlder();
    this.follow();
  }
  Transcript.prototype.setState = function (state, message) {
    this.box.dataset.state = state;
    if (!this.banner) return;
    if (!this.banner.dataset.text) this.banner.dataset.text = this.banner.textContent;
    this.banner.textContent = state === "quota" ? message : this.banner.dataset.text;
    this.banner.hidden = state !== "reconnecting" && state !== "quota";
    if (state === "reconnecting" || state === "live") A.setAway("stream", state === "reconnecting");
  };
  Transcript.prototype.fetchRows = function (param, seq) {
    var url = this.rowsUrl + "?" + param + "=" + seq;
    return fetch(url, {credentials: "same-origin", cache: "no-store",
                       headers: {"X-Alineo-Fragment": "1", "HX-Current-URL": location.href}})
      .then(function (r) {
        var login = r.headers.get("HX-Redirect");
        if (login) { location.href = login; throw new Error("logged out"); }
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text().then(function (html) {
          var t = document.createElement("template"); t.innerHTML = html;
          return {rows: Array.prototype.slice.call(t.content.querySelectorAll("li[data-seq]")),
                  hasMore: r.headers.get("X-Alineo-Has-More") === "1"};
        });
      });
  };
  Transcript.prototype.atBottom = function () {
    var b = this.box; return b.scrollHeight - b.scrollTop - b.clientHeight < 40;
  };
  // Append rows after the cursor until we reach what the stream announced.
  Transcript.prototype.pull = function () {
    var self = this;
    if (self.pulling || self.cursor >= self.head) return;
    self.pulling = true;
    var stick = self.atBottom();
    self.fetchRows("after", self.cursor).then(function (page) {
      var added = [];
      page.rows.forEach(function (li) {
        var seq = parseInt(li.dataset.seq, 10);
        if (seq <= self.cursor || document.getElementById("row-" + seq)) return;  // never twice
        if (seq !== self.cursor + 1) return;  // never skip: only the next seq may follow
        self.rows.appendChild(li); self.cursor = seq; added.push(li);
      });
      A.fold(self.rows, added);
      A.notifyEnds(self.box, added);
      added = added.length;
      if (added) {
        var empty = document.getElementById("no-events"); if (empty) empty.remove();
        if (!self.first) self.first = parseInt(self.rows.firstElementChild.dataset.seq, 10);
        self.box.dataset.cursor = String(self.cursor);
        A.refreshTimes(self.rows);
        if (stick) self.box.scrollTop = self.box.scrollHeight;
        // The header follows the transcript now, not at its next 2 s poll.
        var head = document.getElementById("agent-live");
        if (head && window.htmx) htmx.trigger(head, "alineo:rows");
      }
      if (self.cursor > self.head) self.head = self.cursor;
      self.pulling = false;
      if (added && self.cursor < self.head) self.pull();
      else if (!added && self.cursor < self.head) setTimeout(function () { self.pull(); }, 500);
    }).catch(function () {
      self.pulling = false;
      setTimeout(function () { self.pull(); }, 1000);
    });
  };
  // Follow the SSE stream: each event only says how far the transcript goes.
  Transcript.prototype.follow = function () {
    var self = this;
    A.follow(self.streamUrl, function () { return self.head; }, {
      state: function (state, message) { self.setState(state, message); },
      open: function () { self.pull(); },
      event: function (seq) {
        if (seq > self.head) self.head = seq;
        self.pull();
      }
    });
  };
  // Older pages: when the top sentinel shows (or its button is pressed).
  Transcript.prototype.watchOlder = function () {
    var self = this, sentinel = self.box.querySelector("#older");
    if (!sentinel) return;
    var button = sentinel.querySelector("#load-older");
    if (button) button.addEventListener("click", function () { self.loadOlder(); });
    if ("IntersectionObserver" in window) {
      new IntersectionObserver(function (entries) {
        if (entries.some(function (e) { return e.isIntersecting; })) self.loadOlder();
      }, {root: self.box, rootMargin: "200px 0px 0px 0px"}).observe(sentinel);
    }
  };
  Transcript.prototype.loadOlder = function () {
    var self = this;
    if (!self.hasOlder || self.loadingOlder || !self.first) return;
    self.loadingOlder = true;
    self.fetchRows("before", self.first).then(function (page) {
      var box = self.box, fromBottom = box.scrollHeight - box.scrollTop;
      var frag = document.createDocumentFragment(), firstSeq = self.first, added = [];
      page.rows.forEach(function (li) {
        var seq = parseInt(li.dataset.seq, 10);
        if (seq < self.first && !document.getElementById("row-" + seq)) {
          frag.appendChild(li); firstSeq = Math.min(firstSeq, seq); added.push(li);
        }
      });
      self.rows.insertBefore(frag, self.rows.firstChild);
      A.fold(self.rows, added);
      box.scrollTop = box.scrollHeight - fromBottom;  // the reading position stays put
      self.first = firstSeq; self.box.dataset.first = String(firstSeq);
      self.hasOlder = page.hasMore && firstSeq > 1;
      self.box.dataset.hasOlder = self.hasOlder ? "1" : "0";
      if (!self.hasOlder) {
        var s = self.box.querySelector("#older");
        s.innerHTML = '<span class="muted small">Start of the transcript</span>';
      }
      A.refreshTimes(self.rows);
      self.loadingOlder = false;
    }).catch(function () { self.loadingOlder = false; });
  };

  // The tree keeps ended agents (and ended subtrees) out of the way unless asked (CSS:
  // .tree-wrap.show-archived); the choice is remembered.
  function archivedToggle() {
    var toggle = document.getElementById("show-archived"), tree = document.getElementById("tree");
    if (!toggle || !tree) return;
    try { toggle.checked = localStorage.getItem("alineo.showArchived") === "1"; } catch (err) { /* private mode */ }
    function apply() {
      tree.classList.toggle("show-archived", toggle.checked);
      try { localStorage.setItem("alineo.showArchived", toggle.checked ? "1" : "0"); } catch (err) { /* ignore */ }
    }
    toggle.addEventListener("change", apply); apply();
  }

  document.addEventListener("DOMContentLoaded", function () {
    archivedToggle();
    var box = document.getElementById("transcript");
    if (box) A.transcript = new Transcript(box);
    A.trees = [];
    document.querySelectorAll(".ws-tree[data-stream-url]").forEach(function (el) {
      A.trees.push(new LiveTree(el));
    });
  });
})();
